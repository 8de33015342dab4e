"""`Accelerator`: one training loop on CPU, one GPU, or many processes.

It composes the packages: accel-state (who am I), accel-precision (one precision object),
accel-parallel (one strategy), accel-data (sharded, resumable loaders), accel-tracking.
Both backend objects are chosen once, in the constructor; afterwards every method calls
them and never branches on the backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import accel_state
from accel._accelerator_state import AcceleratorState
from accel._checkpoint import Checkpointer
from accel._config import ProfileKwargs, ProjectConfiguration, sort_kwargs_handlers
from accel._data_loader import DataLoaderDispatcher, DataLoaderShard, iteration_observer
from accel._dynamo import TorchDynamoPlugin, compile_model, resolve_dynamo_plugin
from accel._gradient_state import GradientAccumulationPlugin, GradientState
from accel._mesh_mixin import MeshMixin
from accel._quantized import check_quantized_placement
from accel._stopping import StoppingMixin
from accel._tracking_mixin import TrackingMixin
from accel._wrappers import AcceleratedOptimizer, AcceleratedScheduler
from accel_data import DataLoaderConfiguration, prepare_data_loader, skip_first_batches
from accel_parallel import (
    JoinsUnevenInputs,
    ProcessInfo,
    Strategy,
    TorchTensorParallelPlugin,
    no_sync_all,
    resolve_strategy,
)
from accel_precision import FP8RecipeKwargs, make_precision
from accel_state import DistributedType, ProcessControl, resolved_launch_config

_NULL_CONTEXT = contextlib.nullcontext()
# Where torch's Join applies: DDP over processes (of any device kind; an assigned
# `state.distributed_type` of another engine turns it off, as in accelerate).
_DATA_PARALLEL_TYPES = frozenset(t for t in DistributedType if t.name.startswith("MULTI_"))


def _from_launch(name: str, code_value: Any, default: Any) -> Any:
    """The code's value if given (warning when `accel launch` said otherwise), else the launch's."""
    launched = resolved_launch_config()
    if code_value is None:
        return launched.get(name, default)
    explicit = launched.get("explicit", list(launched))  # what a flag or the file set
    if name in launched and name in explicit and launched[name] != code_value:
        warnings.warn(
            f"The code sets {name}={code_value!r} but `accel launch` was configured with "
            f"{name}={launched[name]!r}; using the code's value.",
            stacklevel=3,
        )
    return code_value


class Accelerator(ProcessControl, TrackingMixin, StoppingMixin, MeshMixin):
    """Runs an ordinary PyTorch training loop unchanged on one or many processes."""

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        *,
        even_batches: bool | None = None,
        dispatch_batches: bool | None = None,
        use_seedable_sampler: bool | None = None,
        strategy: str | Strategy | None = None,
    ) -> None:
        """accelerate's arguments, plus `strategy`: a registered strategy's name ("ddp",
        "fsdp", "deepspeed", "mesh", "pipeline", "single_device", or one registered with
        accel_parallel.register_strategy) or a ready Strategy, beside the familiar plugins
        (which configure the named strategy)."""
        handlers = sort_kwargs_handlers(kwargs_handlers)
        self.state = AcceleratorState(
            cpu=cpu, init_process_group_kwargs=handlers.get("init_process_group")
        )
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = _rng_types(rng_types)
        self.dataloader_config = _dataloader_config(
            dataloader_config, split_batches, even_batches, dispatch_batches, use_seedable_sampler
        )
        project = project_config or ProjectConfiguration()  # held by the Checkpointer
        if project_dir is not None:
            project.set_directories(project_dir)

        mode = str(_from_launch("mixed_precision", mixed_precision, "no"))
        launched = resolved_launch_config()
        fp8_kwargs = handlers.get("fp8")
        if fp8_kwargs is None and mode == "fp8" and launched.get("fp8_config"):
            fp8_kwargs = FP8RecipeKwargs.from_config(launched["fp8_config"])  # accel launch --fp8_*
        info = ProcessInfo(
            device=self.device,
            num_processes=self.num_processes,
            process_index=self.process_index,
            local_process_index=self.local_process_index,
        )
        # One place decides the engine, from every source (accel-parallel's resolver); the
        # precision object is then made for it (a sharded engine needs a sharded scaler).
        engine = resolve_strategy(
            info,
            strategy=strategy,
            ddp_kwargs=handlers.get("ddp"),
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=_one_of(deepspeed_plugin, deepspeed_plugins, "deepspeed_plugin"),
            torch_tp_plugin=torch_tp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            parallelism_config=parallelism_config,
            launch_config=launched,
            environ=os.environ,
            mixed_precision=mode,
        )
        self.strategy, self.parallelism_config = engine.strategy, engine.parallelism_config
        if self.strategy.engine_precision is not None:
            mode = "no"  # the engine casts the model and scales the loss itself
        self.precision = make_precision(
            mode,
            device_type=self.device.type,
            autocast_kwargs=handlers.get("autocast"),
            scaler_kwargs=handlers.get("scaler"),
            fp8_kwargs=fp8_kwargs,
            sharded=self.strategy.sharded,
        )
        self.strategy.attach_precision(self.precision)
        self.dynamo_plugin = resolve_dynamo_plugin(
            dynamo_backend, dynamo_plugin, launched.get("dynamo_config") or {}
        )
        if gradient_accumulation_steps is None and gradient_accumulation_plugin is None:
            gradient_accumulation_steps = self.strategy.default_accumulation_steps()
        self.gradient_state = GradientState(
            _accumulation_plugin(gradient_accumulation_plugin, gradient_accumulation_steps)
        )
        self.profile_handler: ProfileKwargs | None = handlers.get("profile")
        # The familiar handler attributes: what kwargs_handlers gave for each kind (or None).
        self.ddp_handler = handlers.get("ddp")
        self.scaler_handler = handlers.get("scaler")
        self.init_handler = handlers.get("init_process_group")
        self.autocast_handler = handlers.get("autocast")
        self.fp8_recipe_handler = handlers.get("fp8")
        AcceleratorState._record(
            mixed_precision=self.mixed_precision,
            deepspeed_plugins=self.strategy.engine_plugins(),
            strategy=self.strategy,
        )
        self._models: list[nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[Any] = []
        self._replaced_optimizers: dict[int, tuple[Any, Any]] = {}
        self._trigger = False
        self._checkpointer = Checkpointer(
            state=self.state, strategy=self.strategy, precision=self.precision,
            gradient_state=self.gradient_state, project_configuration=project,
            models=self._models, optimizers=self._optimizers, schedulers=self._schedulers,
            dataloaders=self._dataloaders,
        )  # fmt: skip
        self._init_tracking(log_with)

    # -- the familiar properties ------------------------------------------------------------
    device = property(lambda self: self.state.device)
    distributed_type = property(lambda self: self.state.distributed_type)
    num_processes = property(lambda self: self.state.num_processes)
    process_index = property(lambda self: self.state.process_index)
    local_process_index = property(lambda self: self.state.local_process_index)
    is_main_process = property(lambda self: self.state.is_main_process)
    is_local_main_process = property(lambda self: self.state.is_local_main_process)
    is_last_process = property(lambda self: self.state.is_last_process)
    use_distributed = property(lambda self: self.state.use_distributed)
    mixed_precision = property(lambda self: self.strategy.engine_precision or self.precision.name)
    deepspeed_plugin = property(lambda self: self.state.deepspeed_plugin)
    deepspeed_config = property(
        lambda self: (
            None if self.deepspeed_plugin is None else self.deepspeed_plugin.deepspeed_config
        )
    )
    is_fsdp2 = property(lambda self: self.strategy.fsdp_plugin is not None)
    scaler = property(lambda self: self.precision.scaler)  # the fp16 GradScaler, else None
    native_amp = property(lambda self: self.precision.name in ("fp16", "bf16"))
    use_stateful_dataloader = property(lambda self: self.dataloader_config.use_stateful_dataloader)
    save_iteration = property(lambda self: self.project_configuration.iteration)
    sync_gradients = property(
        lambda self: self.gradient_state.sync_gradients,
        lambda self, value: self.gradient_state._set_sync_gradients(value),
        doc="Whether the next optimizer step applies (the end of an accumulation cycle).",
    )
    split_batches = property(lambda self: self.dataloader_config.split_batches)
    even_batches = property(lambda self: self.dataloader_config.even_batches)
    dispatch_batches = property(lambda self: self.dataloader_config.dispatch_batches)
    non_blocking = property(lambda self: self.dataloader_config.non_blocking)
    use_seedable_sampler = property(lambda self: self.dataloader_config.use_seedable_sampler)
    project_dir = property(lambda self: self.project_configuration.project_dir)
    logging_dir = property(lambda self: self.project_configuration.logging_dir)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin = dataclasses.replace(
            self.gradient_state.plugin, num_steps=steps
        )

    @property
    def step(self) -> int:
        """Micro-batches since the start or the last end of a dataloader (under `accumulate`)."""
        return self.gradient_state.micro_step

    @step.setter
    def step(self, value: int) -> None:
        self.gradient_state.micro_step = int(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    # -- prepare ------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and dataloaders, in any order and number.

        Returns them in the same order (a single object when one was passed). Objects of
        other types are returned untouched.
        """
        placement = device_placement or [self.device_placement] * len(args)
        if len(placement) != len(args):
            raise ValueError(
                f"device_placement has {len(placement)} entries for {len(args)} objects."
            )
        result = list(args)
        models = [i for i, a in enumerate(args) if isinstance(a, nn.Module)]
        optims = [i for i, a in enumerate(args) if isinstance(a, torch.optim.Optimizer)]
        raw_optims = [getattr(args[i], "optimizer", args[i]) for i in optims]
        steps = self.strategy.accumulation_steps(self.gradient_accumulation_steps)
        if steps != self.gradient_accumulation_steps:  # an engine config fixes its own
            self.gradient_accumulation_steps = steps
        self.strategy.begin_prepare(
            args,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            split_batches=self.split_batches,
            sync_gradients=lambda: self.gradient_state.sync_gradients,
        )
        prepared = self._prepare_models(
            [args[i] for i in models], raw_optims, [placement[i] for i in models]
        )
        for i, model in zip(models, prepared):
            result[i] = model
        for i in optims:
            swap = self._replaced_optimizers.get(id(getattr(args[i], "optimizer", args[i])))
            result[i] = self._prepare_optimizer(args[i] if swap is None else swap[1])
        for i, obj in enumerate(args):
            if _is_scheduler(obj):
                result[i] = self._prepare_scheduler(obj)
            elif isinstance(obj, torch.utils.data.DataLoader):
                result[i] = self._prepare_dataloader(obj, placement[i])
        _mark_prepared(
            result, (self._models, self._optimizers, self._schedulers, self._dataloaders)
        )
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> nn.Module:
        placement = self.device_placement if device_placement is None else device_placement
        check_quantized_placement(model, self.device, self.num_processes > 1)
        if evaluation_mode:
            model = self.precision.wrap_forward(self.precision.convert_module(model))
            model = model.to(self.device) if placement else model
            return compile_model(model, self.dynamo_plugin, model)
        return self._prepare_models([model], [], [placement])[0]

    def _prepare_models(
        self, models: list[nn.Module], optimizers: list[Any], placements: list[bool]
    ) -> list[nn.Module]:
        """Convert each new model for the precision, then hand the models of this call with
        their optimizers to the strategy, which wraps or shards them (and may re-point the
        optimizers at new parameters); compile last when asked."""
        out = list(models)
        todo, kept, known = [], [], set()
        for i, model in enumerate(models):
            if any(model is m or self.unwrap_model(m) is model for m in self._models):
                known.add(i)  # prepared before: returned as it is
                continue
            check_quantized_placement(model, self.device, self.num_processes > 1)
            spread = _devices_of_dispatched(model)
            if spread and (self.num_processes > 1 or self.strategy.sharded):
                raise ValueError(
                    f"This model was dispatched over several devices ({spread}); strategy "
                    f"{self.strategy.name!r} on {self.num_processes} process(es) needs each "
                    "process to hold a whole copy or a shard. Load it on one device per process "
                    "(device_map={'': accelerator.local_process_index}) or shard it with FSDP."
                )
            model = self.precision.convert_module(model, *optimizers)
            out[i] = self.precision.wrap_forward(model)
            if spread:
                continue  # one process: it keeps its placement (naive model parallelism)
            if placements[i] or self.strategy.sharded:
                todo.append(i)
            elif self.num_processes > 1:
                kept.append(i)  # wrapped for DDP where it is (device_placement=False)
        if todo:
            wrapped, new = self.strategy.prepare([out[i] for i in todo], optimizers)
            self._note_replaced(optimizers, new)
            for i, model in zip(todo, wrapped):
                out[i] = model
        if kept:
            with self.strategy.keeping_placement():
                wrapped, new = self.strategy.prepare([out[i] for i in kept], optimizers)
            self._note_replaced(optimizers, new)
            for i, model in zip(kept, wrapped):
                out[i] = model
        for i, model in enumerate(out):
            if i in known:
                continue
            out[i] = compile_model(model, self.dynamo_plugin, self.strategy.unwrap_model(model))
            self._models.append(out[i])
        return out

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        wrapped = AcceleratedOptimizer(
            optimizer, self.precision, self.gradient_state, self.strategy
        )
        self._optimizers.append(wrapped)
        return wrapped

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        return self._prepare_optimizer(optimizer)

    def _note_replaced(self, optimizers: list[Any], new: list[Any]) -> None:
        """Remember the optimizers a strategy replaced (an engine's own optimizer), so that
        prepare returns the replacement and schedulers made for the original follow it."""
        for old, replacement in zip(optimizers, new):
            if replacement is not old:
                self._replaced_optimizers[id(old)] = (old, replacement)

    def _prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        swap = self._replaced_optimizers.get(id(getattr(scheduler, "optimizer", None)))
        if swap is not None:
            scheduler.optimizer = swap[1]
        inner = getattr(scheduler, "optimizer", None)
        optimizers = [o for o in self._optimizers if o.optimizer is inner or o is inner]
        if inner is not None and not optimizers:
            raise ValueError(
                "prepare() got a scheduler whose optimizer was not prepared; pass the optimizer "
                "to prepare() too (before or together with its scheduler)."
            )
        if isinstance(inner, AcceleratedOptimizer):
            scheduler.optimizer = inner.optimizer
        owned = self.strategy.engine_scheduler(scheduler)  # the engine steps it itself
        wrapped = AcceleratedScheduler(
            scheduler if owned is None else owned,
            optimizers,
            self.gradient_state,
            stepped_by_engine=owned is not None,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            num_processes=self.strategy.data_parallel_size,  # one step per data-parallel replica
        )
        self._schedulers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        return self._prepare_scheduler(scheduler)

    def _prepare_dataloader(self, dataloader: Any, placement: bool) -> Any:
        # Processes of one tensor/context-parallel group read the same batches.
        if self.dispatch_batches and self.strategy.data_parallel_size != self.num_processes:
            raise ValueError(
                f"dispatch_batches=True sends one batch slice to each of the {self.num_processes} "
                f"processes, but this device mesh has {self.strategy.data_parallel_size} "
                f"data-parallel ranks; use dispatch_batches=False (each data-parallel rank reads "
                f"its own batches)."
            )
        prepared = prepare_data_loader(
            dataloader,
            num_processes=self.strategy.data_parallel_size,
            process_index=self.strategy.data_parallel_rank,
            device=self.device,
            put_on_device=placement,
            iteration_observer=self._iteration_observer(),
            shard_class=DataLoaderShard,
            dispatcher_class=DataLoaderDispatcher,
            **self.dataloader_config.prepare_kwargs(),
        )
        prepared.gradient_state = self.gradient_state
        self._dataloaders.append(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        return self._prepare_dataloader(data_loader, placement)

    def _iteration_observer(self) -> Any:
        """What a prepared loader tells when an iteration starts and ends (see _data_loader)."""
        return iteration_observer(self.gradient_state, self.rng_types)

    # -- the step -----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward()`, divided by the accumulation steps and scaled for fp16.

        `scale_wrt_gas=False` (the keyword accelerate's DeepSpeed path takes, and transformers'
        Trainer passes after dividing the loss itself) leaves the loss undivided."""
        scale = kwargs.pop("scale_wrt_gas", True) if kwargs else True
        steps = self.gradient_state.plugin.num_steps  # gradient_accumulation_steps, read once
        if scale and steps > 1:
            loss = loss / steps
        self.strategy.backward(loss, self.precision.backward, **kwargs)

    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[None]:
        """One micro-batch: gradients sync (and the optimizer steps) every N micro-batches and
        on the last batch of the dataloader; in between, `no_sync` skips the all-reduce.

        Called once per step, so it avoids generator-based context managers (a measurable
        share of a tiny model's step)."""
        gradient_state = self.gradient_state
        gradient_state.advance()
        if gradient_state.sync_gradients or not models or not self.strategy.supports_no_sync:
            return _NULL_CONTEXT
        if gradient_state.plugin.sync_each_batch:
            return _NULL_CONTEXT
        return no_sync_all(self.strategy, models)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        with self.strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Train on inputs of different lengths per process without hanging (DDP).

        Inside the block, `torch.distributed.algorithms.Join` lets a process that ran out of
        batches shadow the collectives of the others. `even_batches` overrides the prepared
        DataLoaders' setting for the block (False: each process keeps its own, shorter share,
        as accelerate does); the loaders get their own setting back afterwards.
        """
        joins = isinstance(self.strategy, JoinsUnevenInputs) and self.num_processes > 1
        if not joins or self.distributed_type not in _DATA_PARALLEL_TYPES:
            if self.distributed_type != DistributedType.NO:  # accelerate's warning
                warnings.warn(
                    "Joining uneven inputs is only supported for multi-GPU training, as a result "
                    "`join_uneven_inputs` will have no effect.",
                    stacklevel=3,
                )
            yield
            return
        restore: list[tuple[Any, bool]] = []
        if even_batches is None:
            even_batches = self.even_batches
        else:
            for loader in self._dataloaders:
                owner = getattr(loader, "batch_sampler", None)
                if not hasattr(owner, "even_batches"):
                    owner = loader if hasattr(loader, "even_batches") else None
                if owner is None or isinstance(loader.dataset, torch.utils.data.IterableDataset):
                    warnings.warn(
                        "join_uneven_inputs(even_batches=...) is only supported for map-style "
                        "datasets; a DataLoader over an iterable dataset keeps its own setting.",
                        stacklevel=3,
                    )
                    continue
                restore.append((owner, owner.even_batches))
                owner.even_batches = even_batches
        try:
            with self.strategy.join(joinables, enable=not even_batches):
                yield
        finally:
            for owner, value in restore:
                owner.even_batches = value

    def trigger_sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Force a gradient sync for the backward in this block (inside a no_sync region)."""
        return self.strategy.sync_in_backward(model)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        targets = self._optimizers if optimizer is None else [optimizer]
        for opt in targets:
            if isinstance(opt, AcceleratedOptimizer):
                opt.unscale_gradients()

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Clip the gradient norm (fp16 gradients are unscaled first). On micro-steps that do
        not sync, gradients are still accumulating: nothing is done and None is returned."""
        if not self.sync_gradients:
            return None
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        if not self.sync_gradients:
            return
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """The precision's autocast; an `AutocastKwargs` given here applies to this block only
        (in place of the one from `kwargs_handlers`)."""
        if autocast_handler is None or not hasattr(self.precision, "autocast_kwargs"):
            return self.precision.autocast()
        return _autocast_with(self.precision, autocast_handler)

    # -- collectives ----------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        return accel_state.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather across processes and drop the duplicates that padded the final batch."""
        all_tensors = _only_tensors(input_data)
        group = self._data_parallel_group()  # each data-parallel replica's samples once
        if group is False:
            data = input_data
            if use_gather_object or not all_tensors:
                data = list(data) if isinstance(data, (list, tuple)) else [data]
        elif use_gather_object or not all_tensors:
            data = accel_state.gather_object(input_data, group=group)
        else:
            data = accel_state.gather(input_data, group=group)
        if not self.gradient_state.end_of_dataloader:
            return data
        remainder = self.gradient_state.remainder
        if remainder < 0:
            warnings.warn(
                "gather_for_metrics: the dataloader's length is unknown, so the padded samples "
                "of the last batch cannot be dropped; drop them yourself.",
                stacklevel=2,
            )
            return data
        if remainder == 0:
            return data
        if isinstance(data, list):
            return data[:remainder]
        return accel_state.recursively_apply(lambda t: t[:remainder], data)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum or average over the data-parallel replicas (every process without a mesh)."""
        group = self._data_parallel_group()
        if group is False:
            return accel_state.reduce(tensor, "none", scale)
        return accel_state.reduce(tensor, reduction, scale, group=group)

    def _data_parallel_group(self) -> Any:
        """The group whose processes hold different samples: None for every process, False
        when this process is its only member (tensor/context parallel alone)."""
        if self.strategy.data_parallel_size == 1 and self.num_processes > 1:
            return False
        return self.strategy.data_parallel_group()

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        return accel_state.pad_across_processes(tensor, dim, pad_index, pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this process; `check_trigger` sees it on every process."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every process if any process called `set_trigger` (then the flag resets)."""
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self._collective_device())
        if accel_state.reduce(flag, "sum").item() > 0:
            self._trigger = False
            return True
        return False

    def _collective_device(self) -> torch.device:
        return torch.device("cpu") if self.state.backend in (None, "gloo") else self.device

    # -- models -------------------------------------------------------------------------------
    def verify_device_map(self, model: nn.Module) -> bool:
        """True when `model` was dispatched over several devices (its `hf_device_map`)."""
        return bool(_devices_of_dispatched(model))

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        inner = self.strategy.unwrap_model(model)
        if keep_torch_compile and hasattr(model, "_orig_mod"):
            # The compiled module, as asked. Compiled over a wrapper (DDP): the user's module
            # under a compiled wrapper of its own, as accelerate returns it; the training model
            # keeps its wrapper (accelerate re-points it, so it no longer syncs gradients).
            stripped = model._orig_mod is not inner
            inner = type(model)(inner, model.dynamo_ctx) if stripped else model
        if not keep_fp32_wrapper:
            inner = self.precision.unwrap_forward(inner)
        return inner

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        if unwrap:
            return self.strategy.model_state_dict(model)
        return model.state_dict()

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save `obj` on the main process (safetensors for a dict of tensors when asked)."""
        if not self.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(obj, os.fspath(f), metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        return skip_first_batches(dataloader, num_batches)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the references the Accelerator holds and empty the device cache."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.wait_for_checkpoint()
        self._staging_buffers.clear()  # an asynchronous save's CPU copies
        gc.collect()
        _empty_cache(self.device)
        return [None] * len(objects)

    clear = free_memory

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """torch.profiler around the block; a Chrome trace per process when a directory is set."""
        from accel._profile import make_profiler

        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with make_profiler(handler, self.device) as prof:
            yield prof
        if handler.output_trace_dir:
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            path = os.path.join(handler.output_trace_dir, f"trace_rank{self.process_index}.json")
            prof.export_chrome_trace(path)

    # -- checkpoints: the Checkpointer (accel._checkpoint) does the work -----------------------
    project_configuration = property(
        lambda self: self._checkpointer.project_configuration,
        lambda self, value: setattr(self._checkpointer, "project_configuration", value),
        doc="The ProjectConfiguration: folders, automatic checkpoint naming, its iteration.",
    )
    # an asynchronous save in flight and its CPU buffers (end_training and free_memory use them)
    _pending_save = property(
        lambda self: self._checkpointer.pending,
        lambda self, value: setattr(self._checkpointer, "pending", value),
    )
    _staging_buffers = property(lambda self: self._checkpointer.staging_buffers)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (anything with state_dict / load_state_dict)."""
        self._checkpointer.register(*objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` before the models are saved; removing a
        model's entry from `weights` skips writing it (the hook saves it its own way)."""
        return self._checkpointer.add_save_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` before the models are loaded; removing a model from
        `models` skips loading it."""
        return self._checkpointer.add_load_hook(hook)

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        async_save: bool | None = None,
    ) -> str:
        """Save everything needed to resume exactly; returns the checkpoint folder.

        With `async_save` (default: ProjectConfiguration.async_save) it returns once every
        tensor is staged in CPU memory and writes in a background thread; see
        `wait_for_checkpoint`."""
        return self._checkpointer.save(output_dir, safe_serialization, async_save)

    def wait_for_checkpoint(self) -> None:
        """Wait until an asynchronous `save_state` is written and marked complete (on every
        process); raise its error if it failed. Does nothing when none is in flight."""
        self._checkpointer.wait()

    def load_state(
        self, input_dir: str | os.PathLike[str] | None = None, **load_kwargs: Any
    ) -> str:
        """Restore what save_state saved; with no path, the newest complete checkpoint.

        `map_location` ("cpu", "on_device" or None) is checked as accelerate checks it; either
        value gives the same result, as the loaded states are copied to where the parameters
        (and the optimizer's states) live, which is where "on_device" reads them to.
        """
        stateful = self.use_stateful_dataloader
        return self._checkpointer.load(input_dir, stateful_loaders=stateful, **load_kwargs)

    def load_state_if_any(self, **load_kwargs: Any) -> str | None:
        """Resume from the newest complete checkpoint when there is one; else start fresh.

        One line at the top of a loop that torchrun may restart (``accel launch
        --max_restarts N``) or a job that is requeued: returns the checkpoint loaded, or
        None. Needs ProjectConfiguration(automatic_checkpoint_naming=True) and a
        project_dir; call it after `prepare` and `register_for_checkpointing`.
        """
        stateful = self.use_stateful_dataloader
        return self._checkpointer.load_if_any(stateful_loaders=stateful, **load_kwargs)

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights for inference, sharded with an index json when large."""
        unwrapped = self.unwrap_model(model)
        self._checkpointer.save_model(
            model, unwrapped, save_directory, max_shard_size, safe_serialization
        )

    def __repr__(self) -> str:
        return f"Accelerator(strategy={self.strategy.name}, mixed_precision={self.mixed_precision!r}, state={self.state!r})"


@contextlib.contextmanager
def _autocast_with(precision: Any, handler: Any) -> Iterator[Any]:
    """The precision's autocast with `handler` in place of its AutocastKwargs for the block."""
    saved = precision.autocast_kwargs
    precision.autocast_kwargs = handler
    try:
        with precision.autocast() as ctx:
            yield ctx
    finally:
        precision.autocast_kwargs = saved


_RNG_TYPES = ("generator", "torch", "cuda", "python", "numpy")


def _rng_types(rng_types: Any) -> list[str]:
    """The generators to synchronize from the main process at each epoch start.

    "generator" (the default) is met by the prepared loaders themselves: process 0's sampler
    generator is sent to the others at each epoch start (a seedable sampler needs nothing:
    its order is a function of (seed, epoch)). "torch", "cuda", "python" and
    "numpy" broadcast the main process's global state of that generator when an epoch
    starts (not when a resumed epoch continues, so a resume stays exact)."""
    if rng_types is None:
        return ["generator"]
    names = [str(getattr(t, "value", t)).lower() for t in rng_types]
    bad = [n for n in names if n not in _RNG_TYPES]
    if bad:
        why = " (TPU/XLA is not provided by accel)" if "xla" in bad else ""
        raise ValueError(f"rng_types {bad} not supported{why}; accepted: {list(_RNG_TYPES)}.")
    return names


def _devices_of_dispatched(model: nn.Module) -> list[str]:
    """The devices of a model dispatched over several (its `hf_device_map`), else []."""
    for module in model.modules():
        device_map = getattr(module, "hf_device_map", None)
        if isinstance(device_map, dict):
            devices = sorted({str(d) for d in device_map.values()})
            return devices if len(devices) > 1 else []
    return []


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    )


def _only_tensors(data: Any) -> bool:
    found = {"other": False}

    def visit(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            return
        if isinstance(obj, (list, tuple)):
            for o in obj:
                visit(o)
        elif isinstance(obj, dict):
            for o in obj.values():
                visit(o)
        else:
            found["other"] = True

    visit(data)
    return not found["other"]


def _empty_cache(device: torch.device) -> None:
    if device.type != "cpu":
        module = torch.get_device_module(device.type)
        if hasattr(module, "empty_cache"):
            module.empty_cache()


def _dataloader_config(
    config: DataLoaderConfiguration | None,
    split_batches: bool | None,
    even_batches: bool | None,
    dispatch_batches: bool | None,
    use_seedable_sampler: bool | None,
) -> DataLoaderConfiguration:
    config = config or DataLoaderConfiguration()
    overrides = {
        k: v
        for k, v in {
            "split_batches": split_batches,
            "even_batches": even_batches,
            "dispatch_batches": dispatch_batches,
            "use_seedable_sampler": use_seedable_sampler,
        }.items()
        if v is not None
    }
    return dataclasses.replace(config, **overrides) if overrides else config


def _one_of(plugin: Any, plugins: Any, name: str) -> Any:
    """`deepspeed_plugin` and `deepspeed_plugins` are one argument under two names."""
    if plugin is not None and plugins is not None:
        raise ValueError(f"pass {name} or {name}s, not both (they are the same argument).")
    return plugin if plugins is None else plugins


def _accumulation_plugin(
    plugin: GradientAccumulationPlugin | None, steps: int | None
) -> GradientAccumulationPlugin:
    if plugin is not None:
        if steps not in (None, 1, plugin.num_steps):
            raise ValueError(
                f"gradient_accumulation_steps={steps} and gradient_accumulation_plugin="
                f"{plugin!r} disagree; pass only the plugin."
            )
        return plugin
    steps = _from_launch("gradient_accumulation_steps", steps, 1)
    return GradientAccumulationPlugin(num_steps=int(steps))


def _mark_prepared(objects: list[Any], kept: tuple[list[Any], ...]) -> None:
    """`_is_accelerate_prepared = True` on what prepare returned and now tracks (the flag
    libraries read to skip preparing twice); other objects pass through unmarked."""
    tracked = {id(o) for group in kept for o in group}
    for obj in objects:
        if id(obj) in tracked:
            try:
                obj._is_accelerate_prepared = True
            except AttributeError:  # an object that takes no attributes stays unmarked
                pass
