"""The strategy interface: one small object per backend, chosen once in `Accelerator.prepare`.

What differs between backends, and what a strategy therefore owns:

- wrapping the model (DDP wraps; FSDP2 shards parameters in place; DeepSpeed builds an engine;
  a single device only moves it);
- the optimizer (FSDP2 replaces parameters, so an optimizer made before sharding must be
  re-pointed; DeepSpeed builds its own);
- backward, optimizer step and accumulation (DeepSpeed owns all three);
- skipping gradient synchronization on accumulation steps (``no_sync``);
- gradient clipping (sharded norms need a collective);
- the state dicts of model and optimizer, full or sharded, and their save/load (a checkpoint
  writes through these methods, never with a hard-coded ``torch.save`` of a wrapped module).

After ``prepare`` the Accelerator only calls these methods; it never branches on the type or
the name. What only some engines can do is a small protocol (`JoinsUnevenInputs`) or a
method with a neutral default (`fsdp_plugin`, `engine_plugins`, `distributed_type`,
`close`: what an engine starts, `end_training` stops; `placement`: where the engine's runtime
puts this process).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from accel_parallel._io import save_object
from accel_parallel.checkpoint import _dcp
from accel_parallel.checkpoint._formats import (
    DCP,
    FULL,
    PIPELINE,
    model_format,
    optimizer_format,
)
from accel_parallel.checkpoint._layout import (
    fsdp_model_file,
    fsdp_model_folder,
    fsdp_optimizer_folder,
    optimizer_file,
    pipeline_folder,
    weights_file,
)


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """What a strategy needs to know about the run; the caller reads it from accel-state."""

    device: torch.device
    num_processes: int = 1
    process_index: int = 0
    local_process_index: int = 0


class Strategy:
    """Base strategy: everything a single process on one device needs; backends override.

    `clip_norm`: clip gradients to this global norm at each optimizer step (Megatron's
    ``gradient_clipping``), None for no clipping of the strategy's own.
    """

    name = "base"  # for messages: the Accelerator never branches on it
    supports_no_sync = False
    sharded = False  # parameters are sharded: fp16 needs a scaler that agrees across ranks
    reshardable = False  # its checkpoints load on a different number of processes
    engine_precision: str | None = None  # the engine casts and scales itself in this mode
    sequence_parallel_backends: tuple[str, ...] = ()  # the ParallelismConfig.sp_backend it runs

    def __init__(self, info: ProcessInfo, *, clip_norm: float | None = None) -> None:
        self.info = info
        self.clip_norm = clip_norm
        self.precision: Any = None

    @property
    def device(self) -> torch.device:
        return self.info.device

    @classmethod
    def placement(cls, environ: Mapping[str, str], *, named: bool) -> ProcessInfo | None:
        """Where this process runs when the engine's runtime decides it rather than accel-state
        (torch-xla's), asked before the process state is made: for a run that names this
        strategy (`named`), or, for one that names none, whether it would place it. None (the
        default): accel-state decides."""
        return None

    def attach_precision(self, precision: Any) -> None:
        """The run's precision object (accel-precision's), made for this strategy: its
        autocast, loss scale and unscale are what the strategy's own steps use."""
        self.precision = precision

    # -- what the familiar API reports (neutral defaults; engines override) -----------------
    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP plugin this strategy shards with (None when it does not use FSDP2)."""
        return None

    def engine_plugins(self) -> dict[str, Any] | None:
        """The engine's named configurations (DeepSpeed's plugins), None without any."""
        return None

    def select_engine_plugin(self, name: str) -> None:
        """Make the named configuration the one the next `prepare` uses."""
        raise ValueError(
            f"strategy {self.name!r} has no named engine configurations to select {name!r} "
            f"from; pass Accelerator(deepspeed_plugins={{name: DeepSpeedPlugin(...)}})."
        )

    def distributed_type(self, topology: Any) -> Any:
        """The `DistributedType` accelerate reports for this engine on a run whose process
        topology alone says `topology` (FSDP, DEEPSPEED, ...; else `topology`)."""
        return topology

    def memory_engine(self) -> tuple[str, dict[str, Any]] | None:
        """How `accel_parallel.memory` estimates this engine: its engine name ("ddp",
        "fsdp2", "zero1".."zero3") and options; None where it is not estimated."""
        return None

    def batch_feeder(self) -> Callable[[Iterator[Any]], Iterator[Any]] | None:
        """How a prepared loader's batches reach the device: a function from the host's
        batches to the device's (XLA's parallel loader); None: the loader moves each batch."""
        return None

    def rng_state(self) -> dict[str, Any]:
        """The device's random state beyond torch.accelerator's, for a checkpoint's RNG file."""
        return {}

    def set_rng_state(self, state: Any) -> None:
        """Restore what `rng_state` captured (entries it does not know are ignored)."""

    # -- what an engine starts, it stops --------------------------------------------------
    def close(self) -> None:
        """Stop what this strategy started (servers, managers, threads): `end_training` calls
        it, and interpreter exit does for an engine that called `close_at_exit`. A second
        call does nothing. Nothing to stop here."""

    def close_at_exit(self) -> None:
        """Run `close` at interpreter exit unless it ran before: an engine calls this when it
        starts something, so that a script needs no name of the engine's to stop it."""
        if not self.__dict__.get("_closes_at_exit"):
            self._closes_at_exit = True
            atexit.register(self.close)

    def forget_close_at_exit(self) -> None:
        """Drop the exit hook of `close_at_exit` (`close` calls this once it has run)."""
        if self.__dict__.pop("_closes_at_exit", False):
            atexit.unregister(self.close)

    # -- data parallel (a device mesh narrows these to its data-parallel dimensions) ------
    device_mesh: Any = None

    @property
    def data_parallel_size(self) -> int:
        """How many different batches one step sees (processes that share one see one)."""
        return self.info.num_processes

    @property
    def data_parallel_rank(self) -> int:
        return self.info.process_index

    def data_parallel_group(self) -> Any:
        """The process group of this process's data-parallel peers (None: every process)."""
        return None

    def context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Split the buffers along their sequence dimension inside the block (context
        parallel); a no-op where there is none."""
        return contextlib.nullcontext()

    # -- preparing -----------------------------------------------------------------------
    def begin_prepare(
        self,
        objects: Sequence[Any],
        *,
        gradient_accumulation_steps: int = 1,
        split_batches: bool = False,
        sync_gradients: Callable[[], bool] | None = None,
    ) -> None:
        """See every object of one `prepare` call before anything is wrapped, with the run's
        accumulation settings and a function telling whether this micro-step syncs (an engine
        that configures itself from data loaders and schedulers reads them here)."""

    def default_accumulation_steps(self) -> int | None:
        """The accumulation steps the engine's own configuration fixes (None: no opinion)."""
        return None

    def accumulation_steps(self, requested: int) -> int:
        """The accumulation steps a `prepare` call counts: the Accelerator's `requested`,
        unless the engine's configuration fixes another (the strategy then warns, naming
        both)."""
        return requested

    def engine_scheduler(self, scheduler: Any) -> Any:
        """The scheduler the engine steps itself in place of `scheduler` (None: the caller
        steps `scheduler`)."""
        return None

    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        """Wrap the models and adapt the optimizers that were prepared in the same call.

        The Accelerator calls this once per `prepare` call with every model and optimizer of
        that call; a strategy may replace any of them (FSDP2 re-points an optimizer made
        before sharding at the sharded parameters)."""
        return [self.wrap_model(m) for m in models], optimizers

    @contextlib.contextmanager
    def keeping_placement(self) -> Iterator[None]:
        """Models wrapped inside the block stay on the devices they are on
        (`Accelerator(device_placement=False)`); a wrapper then uses the model's device."""
        saved, self._keep_placement = getattr(self, "_keep_placement", False), True
        try:
            yield
        finally:
            self._keep_placement = saved

    def move_model(self, model: nn.Module) -> nn.Module:
        if any(p.device.type == "meta" for p in model.parameters()):
            raise ValueError(
                "The model has parameters on the meta device (made under init_empty_weights?); "
                "load its weights first (e.g. load_checkpoint_in_model) before prepare()."
            )
        if getattr(self, "_keep_placement", False):
            return model
        return model.to(self.device)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def sequence_loader(self, loader: Any) -> Any:
        """`loader` as the model prepared in the same call reads it: split along the sequence
        where the strategy runs sequence parallel (DeepSpeed's Ulysses), else `loader`."""
        return loader

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module under any wrapper this strategy added (or torch.compile's)."""
        return unwrap_parallel(model)

    # -- the step --------------------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip gradient synchronization for the block (a no-op where nothing is synced)."""
        return contextlib.nullcontext()

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Synchronize gradients in the backward of this block even inside `no_sync`."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, backward_fn: Callable[..., None], **kwargs: Any) -> None:
        """Run the backward. `backward_fn` is the precision object's (it scales for fp16)."""
        backward_fn(loss, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        """Step `optimizer` through the precision object (which unscales and skips the step on
        an fp16 overflow); False when the step was skipped. With `clip_norm` set (Megatron's
        ``gradient_clipping``), gradients are clipped to that global norm first. Engines
        that own the step override it."""
        if self.clip_norm:
            precision.unscale_once(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            self.clip_grad_norm_(params, self.clip_norm)
        return precision.step(optimizer)

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        return nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[nn.Parameter], clip_value: float) -> None:
        nn.utils.clip_grad_value_(list(parameters), clip_value)

    # -- state -------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of the user's module, on every process."""
        return self.unwrap_model(model).state_dict()

    def load_model_state_dict(
        self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> Any:
        return self.unwrap_model(model).load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """The optimizer's state; `model` is the one it trains (sharded strategies need it)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        model: nn.Module | None = None,
    ) -> None:
        optimizer.load_state_dict(state_dict)

    def gradients_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This process's accumulated gradients (saved in the middle of an accumulation)."""
        return {
            n: p.grad.detach().cpu()
            for n, p in self.unwrap_model(model).named_parameters()
            if p.grad is not None
        }

    def load_gradients_state(self, model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
        for name, param in self.unwrap_model(model).named_parameters():
            param.grad = grads[name].to(param.device) if name in grads else None

    # -- files (a checkpoint goes through these; sharded strategies write per-rank shards) ----
    def save_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        writer: bool,
        write_full: Callable[[dict[str, torch.Tensor], Path], None],
    ) -> None:
        """Write the model's weights under `directory` / `name`.

        This strategy gathers the full state dict and `write_full` (the caller's format:
        safetensors or torch) writes it on the writing process; a sharded strategy writes one
        shard per process instead. The names are the user's module's (no ``module.`` of a
        DDP wrapper), as accelerate writes them.
        """
        state = self.model_state_dict(model)
        if writer:
            write_full(state, directory / name)

    def load_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        read_full: Callable[[Path], dict[str, torch.Tensor]],
        strict: bool = True,
    ) -> None:
        """Load model `name` from `directory`, whichever format it was saved in: the folder's
        kind (`accel_parallel.checkpoint._formats`) picks the loader."""
        found = model_format(directory, name)
        if found is None:
            raise FileNotFoundError(
                f"the checkpoint in {directory} holds no weights for {name!r}: none of "
                f"{weights_file(name)}, {weights_file(name, safe=False)}, "
                f"{fsdp_model_folder(name)}/, {fsdp_model_file(name)}, {pipeline_folder(name)}/."
            )
        kind, path = found
        if kind in (DCP, PIPELINE):  # sharded: DCP reads it whatever the saved placements
            return self.load_model_folder(model, path, strict=strict)
        if kind == FULL:
            self.load_full_model(model, lambda: read_full(directory / name), kind, strict=strict)
        else:
            self.load_full_model(model, lambda: load_torch_file(path), kind, strict=strict)

    def load_full_model(
        self,
        model: nn.Module,
        read: Callable[[], dict[str, torch.Tensor]],
        kind: str,
        strict: bool = True,
    ) -> None:
        """Load a full copy of the weights, which `read()` reads from a file of `kind`."""
        state = strip_wrapper_prefixes(read(), self.unwrap_model(model))
        self.load_model_state_dict(model, state, strict=strict)

    def load_model_folder(self, model: nn.Module, folder: Path, strict: bool = True) -> None:
        """Load a model's DCP folder (any saved layout) into `model` as this strategy holds
        it: here whole, into the user's module."""
        _dcp.load_whole_model(self.unwrap_model(model), folder)

    def save_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        *,
        writer: bool,
        model: nn.Module | None = None,
    ) -> None:
        state = self.optimizer_state_dict(optimizer, model)
        if writer:
            save_object(state, directory / optimizer_file(name))

    def optimizer_model(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None
    ) -> nn.Module | None:
        """The module whose parameters `optimizer` trains, as DCP keys its state."""
        return None if model is None else self.unwrap_model(model)

    def load_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        model: nn.Module | None = None,
    ) -> None:
        """Load optimizer `name` from `directory`, whichever format it was saved in."""
        found = optimizer_format(directory, name)
        if found is None:
            raise FileNotFoundError(
                f"the checkpoint in {directory} has no {optimizer_file(name)} (nor the folder "
                f"{fsdp_optimizer_folder(name)}/ or {pipeline_folder(name)}/)"
            )
        kind, path = found
        if kind == FULL:
            state = load_torch_file(path)
            return self.load_optimizer_state_dict(optimizer, state, model)
        trained = self.optimizer_model(optimizer, model)
        if trained is None:
            raise ValueError(
                f"{path.name} is a sharded optimizer state, keyed by the parameters of its "
                f"model; load it with the model prepared together with the optimizer."
            )
        if kind == PIPELINE:
            return _dcp.load_flat_optimizer(trained, optimizer, path)
        return _dcp.load_sharded_optimizer(trained, optimizer, path)


def prepared_with(
    models: dict[int, nn.Module],
    optimizer: torch.optim.Optimizer,
    model: nn.Module | None,
    kind: str,
) -> nn.Module:
    """The model `optimizer` trains: `model` when given, else the one prepared with it
    (`models`, keyed by the optimizer's id); a clear error naming `kind` when there is none."""
    model = model or models.get(id(optimizer))
    if model is None:
        raise ValueError(
            f"This optimizer was not prepared together with {kind}: pass the model and its "
            f"optimizer to the same prepare() call."
        )
    return model


def load_torch_file(path: Path) -> Any:
    """A checkpoint file of tensors and plain values, on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=True)


def unwrap_parallel(model: nn.Module) -> nn.Module:
    """The user's module under torch.compile's and data-parallel wrappers (DDP, DataParallel)."""
    inner = model
    while True:
        if hasattr(inner, "_orig_mod"):  # torch.compile
            inner = inner._orig_mod
        elif isinstance(inner, nn.parallel.DistributedDataParallel | nn.DataParallel):
            inner = inner.module
        else:
            return inner


_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def strip_wrapper_prefixes(
    state: dict[str, torch.Tensor], module: nn.Module
) -> dict[str, torch.Tensor]:
    """`state` with wrapper prefixes removed from the names that `module` does not have (a
    checkpoint saved from the state dict of a wrapped model loads into the bare one)."""
    expected = set(module.state_dict())
    out = {}
    for name, value in state.items():
        key = name
        while key not in expected and key.startswith(_WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


@runtime_checkable
class JoinsUnevenInputs(Protocol):
    """A strategy whose processes may run out of batches at different steps without hanging
    (torch's `Join`, which DDP supports): `join` is that block."""

    def join(
        self, joinables: list[Any], *, enable: bool
    ) -> contextlib.AbstractContextManager[None]: ...


@contextlib.contextmanager
def no_sync_all(strategy: Strategy, models: Iterable[nn.Module]) -> Iterator[None]:
    """Enter `strategy.no_sync` for several models at once."""
    with contextlib.ExitStack() as stack:
        for model in models:
            stack.enter_context(strategy.no_sync(model))
        yield
