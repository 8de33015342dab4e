"""DeepSpeed ZeRO 0-3: the engine owns backward, step and the accumulation boundary.

`prepare` builds one `deepspeed.initialize` engine per model, with the plugin that is active at
that moment; the config's "auto" entries are filled from the run first (`_deepspeed_fill`).
The loop stays the user's: the Accelerator divides the loss by the accumulation steps (the
engine does not divide again), tells the engine whether this backward ends an accumulation,
and steps it from the prepared optimizer's `step()`, once per optimizer step. Clipping happens
only where asked: a number in the config / plugin, or `clip_grad_norm_` in the loop, which
returns the global norm before clipping and clips in the engine's step that follows.
deepspeed is imported when the first engine is built. Under a ParallelismConfig with
``sp_size > 1`` the engine trains with DeepSpeed's sequence parallel (`_deepspeed_ulysses`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_parallel._deepspeed_fill import fill_auto
from accel_parallel._deepspeed_parts import (
    cast_inputs,
    cpu_optimizer,
    pair_optimizers,
    set_moe_leaves,
)
from accel_parallel._deepspeed_plugin import (
    INSTALL,
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    import_deepspeed,
)
from accel_parallel._deepspeed_reshard import (
    engine_data_parallel_size,
    load_universal,
    needs_universal,
)
from accel_parallel._deepspeed_ulysses import UlyssesSequenceParallel
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy
from accel_parallel.checkpoint import engine_tag

logger = logging.getLogger("accel_parallel.deepspeed")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def normalize_plugins(plugins: Any) -> dict[str, DeepSpeedPlugin]:
    """{name: plugin} from one plugin or a dict; the first is selected when none is."""
    if isinstance(plugins, DeepSpeedPlugin):
        plugins = {"default": plugins}
    if not isinstance(plugins, Mapping) or not plugins:
        raise TypeError(
            f"deepspeed_plugin(s) must be a DeepSpeedPlugin or a non-empty dict of them, not "
            f"{type(plugins).__name__}."
        )
    bad = [k for k, v in plugins.items() if not isinstance(v, DeepSpeedPlugin)]
    if bad:
        raise TypeError(f"deepspeed_plugins entries {bad} are not DeepSpeedPlugin objects.")
    plugins = dict(plugins)
    if not any(p.selected for p in plugins.values()):
        next(iter(plugins.values())).select(_from_accelerator_state=True)
    return plugins


class DeepSpeedStrategy(Strategy):
    """ZeRO stages 0-3 through `deepspeed.initialize`, one engine per prepared model;
    `sequence_parallel` (DeepSpeed's ALST / Ulysses) splits each sample's sequence over its
    ranks."""

    name = "deepspeed"
    sequence_parallel_backends = ("deepspeed",)
    sharded = True
    reshardable = True  # ZeRO partitions from another size load as a universal checkpoint

    def __init__(
        self,
        info: ProcessInfo,
        plugins: Any,
        mixed_precision: str = "no",
        *,
        clip_norm: float | None = None,
        sequence_parallel: UlyssesSequenceParallel | None = None,
    ) -> None:
        super().__init__(info, clip_norm=clip_norm)
        self.sequence_parallel = sequence_parallel
        if importlib.util.find_spec("deepspeed") is None:
            raise ImportError(f"The DeepSpeed strategy needs deepspeed: `{INSTALL}`.")
        self.plugins = normalize_plugins(plugins)
        self._modes = {n: p.set_mixed_precision(mixed_precision) for n, p in self.plugins.items()}
        self.engine_precision = self._modes[self._active_name()]
        self._engines: list[Any] = []
        self._engine_of_optimizer: dict[int, Any] = {}
        self._engine_schedulers: dict[int, Any] = {}
        self._schedulers_by_optimizer: dict[int, Any] = {}
        self._micro_batch: int | None = None
        self._accumulation_steps = 1
        self._split_batches = False
        self._auto_clipped: set[int] = set()  # engines whose gradient_clipping was "auto"
        self._sync: Callable[[], bool] = lambda: True
        self._clip: dict[int, float] = {}  # engine id -> max_norm for its next step
        self._keep: list[Any] = []

    # -- plugins ---------------------------------------------------------------------------
    def engine_plugins(self) -> dict[str, DeepSpeedPlugin]:
        return self.plugins

    def distributed_type(self, topology: Any) -> Any:
        from accel_state import DistributedType

        return DistributedType.DEEPSPEED

    def memory_engine(self) -> tuple[str, dict[str, Any]]:
        plugin = self.active_plugin
        stage = 2 if plugin.zero_stage is None else int(plugin.zero_stage)
        if stage == 0:
            return "ddp", {"activation_checkpointing": False}
        offload = (plugin.offload_optimizer_device or "none") != "none"
        return f"zero{stage}", {"offload": offload, "activation_checkpointing": False}

    def _active_name(self) -> str:
        return next(name for name, p in self.plugins.items() if p.selected)

    @property
    def active_plugin(self) -> DeepSpeedPlugin:
        return self.plugins[self._active_name()]

    def select_engine_plugin(self, name: str) -> None:
        if name not in self.plugins:
            raise ValueError(f"no DeepSpeed plugin named {name!r}; known: {sorted(self.plugins)}.")
        for key, plugin in self.plugins.items():
            if key == name:
                plugin.select(_from_accelerator_state=True)
            else:
                plugin._unselect()

    def default_accumulation_steps(self) -> int | None:
        steps = self.active_plugin.get_value("gradient_accumulation_steps")
        return None if steps in (None, "auto") else int(steps)

    def accumulation_steps(self, requested: int) -> int:
        """A number written in the active config wins over the Accelerator's `requested`,
        as in accelerate, with a warning naming both; "auto" (or none) takes `requested`."""
        written = self.default_accumulation_steps()
        if written is None or written == requested:
            return requested
        warnings.warn(
            f"gradient_accumulation_steps: the Accelerator has {requested} but the DeepSpeed "
            f"config has {written}; using the config's {written} (as accelerate does). Pass "
            f'gradient_accumulation_steps={written}, or write "auto" in the config to use '
            f"the Accelerator's.",
            stacklevel=3,
        )
        return written

    # -- preparing -------------------------------------------------------------------------
    def begin_prepare(
        self,
        objects: Sequence[Any],
        *,
        gradient_accumulation_steps: int = 1,
        split_batches: bool = False,
        sync_gradients: Callable[[], bool] | None = None,
    ) -> None:
        sizes = []
        for obj in objects:
            if isinstance(obj, torch.utils.data.DataLoader):
                size = obj.batch_size or getattr(obj.batch_sampler, "batch_size", None)
                if size is not None:
                    sizes.append(size // self.info.num_processes if split_batches else size)
            elif isinstance(obj, DummyScheduler) or (
                hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
            ):
                self._schedulers_by_optimizer[id(obj.optimizer)] = obj
        if sizes:
            pick = min if self.active_plugin.is_train_batch_min else max
            self._micro_batch = pick(sizes)
        self._accumulation_steps = gradient_accumulation_steps
        self._split_batches = split_batches
        if sync_gradients is not None:
            self._sync = sync_gradients

    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        owners = pair_optimizers(models, optimizers)
        out_models, replaced = [], {id(o): o for o in optimizers}
        for model in models:
            optimizer = owners.get(id(model))
            engine, new_optimizer = self._initialize(model, optimizer)
            out_models.append(engine)
            if optimizer is not None:
                replaced[id(optimizer)] = new_optimizer
        return out_models, [replaced[id(o)] for o in optimizers]

    def _initialize(self, model: nn.Module, optimizer: Any) -> tuple[Any, Any]:
        deepspeed = import_deepspeed()
        self._ensure_process_group()
        plugin = self.active_plugin
        if any(p.device.type == "meta" for p in model.parameters()):
            raise ValueError(
                "The model has parameters on the meta device; load its weights before prepare()."
            )
        scheduler = self._schedulers_by_optimizer.get(id(optimizer)) if optimizer else None
        original = optimizer
        if optimizer is not None and plugin.offload_optimizer_device != "none":
            optimizer = cpu_optimizer(optimizer, plugin)
        sp = self.sequence_parallel
        config = fill_auto(
            plugin, model=model, optimizer=optimizer, scheduler=scheduler,
            micro_batch=self._micro_batch, accumulation_steps=self._accumulation_steps,
            data_parallel_size=self.data_parallel_size // (sp.sp_size if sp else 1),
            split_batches=self._split_batches,
        )  # fmt: skip
        auto_clipped = "gradient_clipping" in plugin.filled
        if self.info.process_index == 0:
            filled = {k: f"{v!r} ({why})" for k, (v, why) in plugin.filled.items()}
            logger.info("DeepSpeed config: %s; filled: %s", json.dumps(config), filled)
        set_moe_leaves(model, plugin)
        kwargs: dict[str, Any] = {"model": model, "config": json.loads(json.dumps(config))}
        if isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
        elif optimizer is not None:
            kwargs["optimizer"] = optimizer
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None:
            kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        if sp is not None and optimizer is not None:  # the trained model shares its sequence
            kwargs["mpu"] = sp.register(model, self._micro_batch)
        engine, _, _, engine_scheduler = deepspeed.initialize(**kwargs)
        if isinstance(scheduler, DummyScheduler):
            self._engine_schedulers[id(scheduler)] = engine_scheduler
        dtype = _DTYPES.get(self._modes[self._active_name()])
        if dtype is not None:
            engine.module.register_forward_pre_hook(cast_inputs(dtype), with_kwargs=True)
        self._engines.append(engine)
        if auto_clipped:
            self._auto_clipped.add(id(engine))
        new_optimizer = optimizer
        if optimizer is not None:
            if isinstance(optimizer, DummyOptim):
                new_optimizer = _base_optimizer(engine)
                if isinstance(scheduler, DummyScheduler):  # it steps what the engine built
                    scheduler.optimizer = new_optimizer
            for opt in (original, optimizer, new_optimizer):
                self._engine_of_optimizer[id(opt)] = engine
                self._keep.append(opt)  # the ids above stay theirs
        return engine, new_optimizer

    def _ensure_process_group(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():  # one process: a group of one, as under a launcher
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        # deepspeed.initialize insists on reading this variable, which launchers set
        os.environ.setdefault("LOCAL_RANK", str(self.info.local_process_index))

    def engine_scheduler(self, scheduler: Any) -> Any:
        """The scheduler the engine built and steps for `scheduler` (a DummyScheduler)."""
        return self._engine_schedulers.get(id(scheduler))

    def move_model(self, model: nn.Module) -> nn.Module:
        return model  # deepspeed.initialize places the model

    def sequence_loader(self, loader: Any) -> Any:
        if self.sequence_parallel is None:
            return loader
        return self.sequence_parallel.adapt_loader(loader, self.device)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return super().unwrap_model(_module(model))

    # -- the step --------------------------------------------------------------------------
    def _trained_engine(self, what: str) -> Any:
        trained = [e for e in self._engines if self._has_optimizer(e)]
        if len(trained) != 1:
            raise RuntimeError(
                f"{what}: {len(trained)} DeepSpeed engines train an optimizer; accel drives "
                f"exactly one trained engine per backward (the other models may be prepared "
                f"without an optimizer, for inference)."
            )
        return trained[0]

    def backward(self, loss: torch.Tensor, backward_fn: Callable[..., None], **kwargs: Any) -> None:
        """The engine's backward. The Accelerator has already divided the loss by the
        accumulation steps, so the engine does not divide it again."""
        engine = self._trained_engine("backward")
        if self.sequence_parallel is not None:
            self.sequence_parallel.check_training(engine.module)
        engine.set_gradient_accumulation_boundary(bool(self._sync()))
        kwargs.pop("scale_wrt_gas", None)  # the loss is divided once, by the Accelerator
        engine.backward(loss, scale_wrt_gas=False, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        engine = self._engine_of(optimizer)
        zero = engine.optimizer
        max_norm = self._clip.pop(id(engine), None)
        if max_norm is None:
            engine.step()
            return bool(engine.was_step_applied())
        saved = getattr(zero, "clip_grad", None)
        config = getattr(engine, "_config", None)
        saved_config = getattr(config, "gradient_clipping", None)
        if saved is not None:
            zero.clip_grad = max_norm
        if saved_config is not None:  # what the engine itself clips to (stage 0)
            config.gradient_clipping = max_norm
        try:
            engine.step()
        finally:
            if saved is not None:
                zero.clip_grad = saved
            if saved_config is not None:
                config.gradient_clipping = saved_config
        return bool(engine.was_step_applied())

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        """Nothing to do: the engine clears its gradients at the end of its step."""

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """The global gradient norm now (before clipping); the engine's coming step clips to
        `max_norm`. Only the 2-norm: DeepSpeed computes no other."""
        if float(norm_type) != 2.0:
            raise ValueError(
                f"clip_grad_norm_(norm_type={norm_type}) under DeepSpeed: only norm_type=2 is "
                f"computed by the engine."
            )
        params = list(parameters)
        engine = self._engine_of_params(params)
        configured = float(engine.gradient_clipping() or 0.0)
        if configured > 0 and configured != float(max_norm) and id(engine) in self._auto_clipped:
            _warn_loop_clip_wins(configured, float(max_norm))
        elif configured > 0 and configured != float(max_norm):
            raise ValueError(
                f"clip_grad_norm_(max_norm={max_norm}) but the DeepSpeed config clips every step "
                f"at gradient_clipping={configured}; use one value, or remove gradient_clipping "
                f"from the config / plugin to clip only in the loop."
            )
        zero = engine.optimizer
        if hasattr(zero, "scaled_global_norm"):  # ZeRO 1 / 2
            norm = zero.scaled_global_norm()
        elif hasattr(zero, "_get_norm_groups"):  # ZeRO 3
            from deepspeed.runtime.utils import combine_grad_norm_groups

            norm = combine_grad_norm_groups(zero._get_norm_groups())
        elif hasattr(zero, "clip_grad"):
            raise NotImplementedError(
                f"clip_grad_norm_ with the {type(zero).__name__} optimizer wrapper: set "
                f"gradient_clipping in the DeepSpeed config instead."
            )
        else:  # stage 0 in fp32: plain gradients, already reduced by the engine's backward
            self._clip[id(engine)] = float(max_norm)  # the engine's own clipping agrees
            return nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0)
        self._clip[id(engine)] = float(max_norm)
        scale = float(getattr(zero, "loss_scale", 1.0) or 1.0)
        return torch.as_tensor(norm, dtype=torch.float32).detach().reshape(()) / scale

    def clip_grad_value_(self, parameters: Iterable[nn.Parameter], clip_value: float) -> None:
        raise NotImplementedError(
            f"clip_grad_value_({clip_value}) is not available under DeepSpeed (its gradients are "
            f"flattened partitions); use accelerator.clip_grad_norm_(parameters, max_norm)."
        )

    def _engine_of(self, optimizer: Any) -> Any:
        engine = self._engine_of_optimizer.get(id(optimizer))
        if engine is None:
            raise ValueError(
                f"this {type(optimizer).__name__} was not prepared together with a model under "
                f"DeepSpeed; pass the model and its optimizer to the same prepare() call."
            )
        return engine

    def _engine_of_params(self, params: list[nn.Parameter]) -> Any:
        ids = {id(p) for p in params}
        for engine in self._engines:
            if any(id(p) in ids for p in engine.module.parameters()):
                return engine
        return self._trained_engine("clip_grad_norm_")

    # -- state -----------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        engine = self._engine_for_model(model)
        if engine is None:
            return super().model_state_dict(model)
        if engine.zero_optimization_stage() == 3:
            if not engine.zero_gather_16bit_weights_on_model_save():
                raise ValueError(
                    "Under ZeRO-3 each process holds a slice of every weight; gathering the full "
                    "weights needs zero3_save_16bit_model=True in the DeepSpeedPlugin (config key "
                    "zero_optimization.stage3_gather_16bit_weights_on_model_save). Set it, or use "
                    "save_state, whose checkpoint keeps the slices."
                )
            state = engine._zero3_consolidated_16bit_state_dict()
            return dict(state) if state is not None else {}
        return engine.module.state_dict()

    def load_model_state_dict(
        self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> Any:
        engine = self._engine_for_model(model)
        if engine is None:
            return super().load_model_state_dict(model, state_dict, strict)
        if engine.zero_optimization_stage() == 3:
            raise NotImplementedError(
                "loading a full state dict into a ZeRO-3 engine is not supported; resume with "
                "load_state (the engine's checkpoint), or load the weights before prepare()."
            )
        result = engine.module.load_state_dict(state_dict, strict=strict)
        refresh = getattr(engine.optimizer, "_restore_from_bit16_weights", None)
        if refresh is not None:  # the fp32 master partitions follow the loaded weights
            refresh()
        return result

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        return self._engine_of(optimizer).optimizer.state_dict()

    def gradients_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        raise NotImplementedError(
            "save_state in the middle of a gradient accumulation is not supported under "
            "DeepSpeed (the accumulated gradients live in the engine's partitions); save when "
            "accelerator.sync_gradients is True."
        )

    def _has_optimizer(self, engine: Any) -> bool:
        """Prepared with an optimizer (a ZeRO-3 engine without one still has a partitioner)."""
        return any(e is engine for e in self._engine_of_optimizer.values())

    def _engine_for_model(self, model: Any) -> Any:
        for engine in self._engines:
            if model is engine or model is engine.module:
                return engine
        return None

    # An engine's checkpoint (its tag folder, named as accelerate names it, and DeepSpeed's
    # `latest` file naming it, as accelerate's saves have) holds its module, optimizer and
    # scheduler together and is written by every process. A trained engine's checkpoint goes
    # with its optimizer's files (so it is written whichever way the model files are
    # written); an engine without an optimizer writes it with the model files. A ZeRO
    # checkpoint of another data-parallel size loads through `_deepspeed_reshard`.
    def save_model_files(
        self, model: nn.Module, directory: Path, name: str, *, writer: bool,
        write_full: Callable[[dict[str, torch.Tensor], Path], None],
    ) -> None:  # fmt: skip
        engine = self._engine_for_model(model)
        if engine is None:
            return super().save_model_files(model, directory, name, writer=writer, write_full=write_full)  # fmt: skip
        if not self._has_optimizer(engine):
            engine.save_checkpoint(str(directory), tag=self._tag(engine))

    def load_model_files(
        self, model: nn.Module, directory: Path, name: str, *,
        read_full: Callable[[Path], dict[str, torch.Tensor]], strict: bool = True,
    ) -> None:  # fmt: skip
        engine = self._engine_for_model(model)
        if engine is None:
            return super().load_model_files(model, directory, name, read_full=read_full, strict=strict)  # fmt: skip
        if not self._has_optimizer(engine):
            _load_engine(engine, directory, self._tag(engine), optimizer=False, strict=strict)

    def save_optimizer_files(
        self, optimizer: torch.optim.Optimizer, directory: Path, name: str, *, writer: bool,
        model: nn.Module | None = None,
    ) -> None:  # fmt: skip
        engine = self._engine_of(optimizer)
        engine.save_checkpoint(str(directory), tag=self._tag(engine))

    def load_optimizer_files(
        self, optimizer: torch.optim.Optimizer, directory: Path, name: str,
        model: nn.Module | None = None,
    ) -> None:  # fmt: skip
        engine = self._engine_of(optimizer)
        _load_engine(engine, directory, self._tag(engine), optimizer=True)

    def _tag(self, engine: Any) -> str:
        """The engine's tag folder, accelerate's name for the model it trains (its index
        among the prepared engines: pytorch_model, pytorch_model_1, ...)."""
        index = next(i for i, e in enumerate(self._engines) if e is engine)
        return engine_tag(index)


def _load_engine(engine: Any, directory: Path, tag: str, *, optimizer: bool, strict: bool = True) -> None:  # fmt: skip
    if not (directory / tag).is_dir():
        raise FileNotFoundError(
            f"the checkpoint in {directory} has no DeepSpeed engine folder {tag!r}."
        )
    saved = needs_universal(engine, directory / tag) if optimizer else None
    if saved is not None:
        logger.info(
            "%s was saved by %d data-parallel ranks, this run has %d: loading it as a "
            "universal checkpoint", directory / tag, saved, engine_data_parallel_size(engine),
        )  # fmt: skip
        load_universal(engine, directory, tag, strict=strict)
        return
    path, _ = engine.load_checkpoint(
        str(directory), tag=tag, load_module_strict=strict, load_optimizer_states=optimizer,
        load_lr_scheduler_states=optimizer,
    )  # fmt: skip
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load its checkpoint {directory / tag}.")


def _module(model: Any) -> nn.Module:
    return getattr(model, "module", model) if type(model).__name__.endswith("Engine") else model


def _base_optimizer(engine: Any) -> Any:
    zero = engine.optimizer
    return getattr(zero, "optimizer", zero)


_warned_clip: set[tuple[float, float]] = set()


def _warn_loop_clip_wins(configured: float, max_norm: float) -> None:
    """The loop's clip_grad_norm_ is more specific than a config's "auto": it wins, once said."""
    if (configured, max_norm) in _warned_clip:
        return
    _warned_clip.add((configured, max_norm))
    warnings.warn(
        f'the DeepSpeed config\'s gradient_clipping "auto" was filled with {configured}, and the '
        f"loop calls clip_grad_norm_(max_norm={max_norm}): the steps after that call clip at "
        f"{max_norm}, the others at {configured}. Write gradient_clipping in the config (or "
        f"DeepSpeedPlugin(gradient_clipping=...)) to choose one value.",
        stacklevel=3,
    )


def _build(request: StrategyRequest) -> DeepSpeedStrategy:
    if request.clip_norm is not None:
        raise ValueError(
            f"MegatronLMPlugin(gradient_clipping={request.clip_norm}) with DeepSpeed: the engine "
            f"clips itself; set gradient_clipping in the DeepSpeed config instead."
        )
    plugins = request.deepspeed_plugin
    if plugins is None:
        plugins = DeepSpeedPlugin.from_launch_config(request.launch_section("deepspeed_config"))
    config = request.parallelism_config
    sp = None
    if config is not None and config.sp_enabled:
        sp = UlyssesSequenceParallel(config.sp_size, config.sp_handler)
    return DeepSpeedStrategy(
        request.info, plugins, mixed_precision=request.mixed_precision, sequence_parallel=sp
    )


def _claims(request: StrategyRequest) -> int | None:
    if request.deepspeed_plugin is not None:
        strength = 40
    elif request.launched_type == "DEEPSPEED":
        strength = 20
    else:
        return None
    config = request.parallelism_config
    if config is not None and config.sp_enabled:
        return 55  # above a device mesh: DeepSpeed makes the sequence-parallel groups
    return strength


register_strategy(DeepSpeedStrategy.name, _build, claims=_claims)
