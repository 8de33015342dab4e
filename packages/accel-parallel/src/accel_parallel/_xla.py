"""XLA devices (TPUs; XLA's CPU backend in tests) through torch-xla.

Two strategies: "xla", one XLA device per process (gradients all-reduced once per optimizer
step over the replicas), and "xla_spmd", one process driving every device of its host with
torch-xla's SPMD (each batch sharded over a 1-D "data" mesh; the compiler inserts the gradient
reduction). Both build on `XLABase`, which is not registered: neither subclasses the other.
torch_xla is imported only when one of them is asked for or selected, and only where it is
installed (`xla_requested`); `pip install "accel-parallel[xla]"` installs it. Each places the
process itself (`Strategy.placement`): torch-xla's runtime, not accel-state, says where it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy
from accel_state.xla_env import xla_requested

INSTALL_HINT = 'pip install "accel-parallel[xla]" torch==<torch-xla\'s version, e.g. 2.9.0>'


def _torch_xla() -> Any:
    """torch_xla, imported, or an ImportError naming the install command (and the torch
    release torch-xla needs, which must be the same)."""
    try:
        import torch_xla
    except ImportError as error:
        raise ImportError(
            f"XLA devices need torch-xla ({error}); install it with: {INSTALL_HINT}"
        ) from None
    wanted = ".".join(str(torch_xla.__version__).split(".")[:2])
    have = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if wanted != have:
        raise ImportError(
            f"torch-xla {torch_xla.__version__} runs on torch {wanted}.x only, and torch "
            f"{torch.__version__} is installed: pip install torch=={wanted}.0"
        )
    return torch_xla


@dataclasses.dataclass(frozen=True)
class XLATopology:
    """Who this process is on XLA, as torch-xla's runtime says (`xla_topology`)."""

    device: torch.device
    num_processes: int
    process_index: int
    local_process_index: int
    spmd: bool
    # This process runs several replicas as threads, one per device, this one among them
    # (torch-xla's xmp.spawn where a process has several devices, without SPMD: TPU v2/v3,
    # XLA's CPU device with CPU_NUM_DEVICES > 1); each thread is then a process to the loop.
    replica_threads: bool = False


def xla_topology(*, spmd: bool = False) -> XLATopology:
    """Start torch-xla's runtime (in SPMD mode when `spmd`) and read this process's place.

    With several replicas, torch-xla's `xla` backend of torch.distributed is registered, so the
    process group (made by accel-state) runs XLA's collectives. Where the replicas are threads
    of this process, each thread reads its own place (torch-xla keeps the device per thread)."""
    torch_xla = _torch_xla()
    import torch_xla.runtime as xr

    if spmd:
        xr.use_spmd()
    device = torch_xla.device()
    world = xr.world_size()
    if world > 1:
        import torch_xla.distributed.xla_backend
    return XLATopology(
        device=torch.device(device),
        num_processes=world,
        process_index=xr.global_ordinal(),
        local_process_index=xr.local_ordinal(),
        spmd=spmd,
        # replicated over more than one device of this process: xmp.spawn made a thread each
        replica_threads=world > 1 and not xr.is_spmd() and xr.addressable_device_count() > 1,
    )


def _placed(spmd: bool) -> ProcessInfo:
    """This process's place as torch-xla's runtime gives it (started in SPMD mode when
    `spmd`); where the runtime runs this process's replicas as threads, accel-state's state is
    split per thread first, so that each thread's Accelerator is its replica's."""
    topology = xla_topology(spmd=spmd)
    if topology.replica_threads:  # xmp.spawn's thread per device: each its own state
        from accel_state import split_state_per_thread

        split_state_per_thread()
    return ProcessInfo(
        device=topology.device,
        num_processes=topology.num_processes,
        process_index=topology.process_index,
        local_process_index=topology.local_process_index,
    )


class XLABase(Strategy):
    """What both XLA strategies do (not registered itself): the model and its optimizer's
    parameters moved to the device, batches fed through torch-xla's parallel loader, a graph
    cut at each optimizer step, state written from the host. `_reduce` is where an engine
    reduces gradients before clipping and stepping (nothing here)."""

    reshardable = True  # full states, written from the host: they load on any engine

    def __init__(self, info: ProcessInfo, *, clip_norm: float | None = None) -> None:
        self._xla = _torch_xla()
        super().__init__(info, clip_norm=clip_norm)
        device = info.device if info.device.type == "xla" else self._xla.device()
        self._device = torch.device(device)
        self._reduced: set[int] = set()  # parameters whose gradients this step reduced
        self._cut_pending = False  # a step ran and its graph was not cut yet (optimizer_step)
        import torch_xla.debug.profiler

        self._profiler = torch_xla.debug.profiler

    @property
    def device(self) -> torch.device:
        return self._device

    def distributed_type(self, topology: Any) -> Any:
        from accel_state import DistributedType

        return DistributedType.XLA

    # -- preparing ------------------------------------------------------------------------
    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        """Move the models to the device and point their optimizers at the moved parameters
        (moving to an XLA device makes new Parameter objects), optimizer state included."""
        before = {id(p): (i, n) for i, m in enumerate(models) for n, p in m.named_parameters()}
        moved = [self.wrap_model(m) for m in models]
        after = {(i, n): p for i, m in enumerate(moved) for n, p in m.named_parameters()}
        for optimizer in optimizers:
            _repoint(optimizer, {k: after[v] for k, v in before.items()}, self.device)
        return moved, optimizers

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return self.move_model(model)

    def batch_feeder(self) -> Callable[[Iterator[Any]], Iterator[Any]]:
        """Batches reach the device through torch-xla's ParallelLoader (background transfer;
        the loader cuts the graph between batches, as torch-xla's MpDeviceLoader does)."""
        return self._feed

    def _input_sharding(self) -> Any:
        return None

    def _feed(self, batches: Iterator[Any]) -> Iterator[Any]:
        import torch_xla.distributed.parallel_loader as pl

        loader = pl.ParallelLoader(
            _Once(batches), [self.device], input_sharding=self._input_sharding()
        )
        try:
            yield from loader.per_device_loader(self.device)
        finally:
            loader.close()

    # -- the step --------------------------------------------------------------------------
    def _reduce(self, parameters: Iterable[nn.Parameter]) -> None:
        """Reduce the gradients of `parameters` before they are clipped or stepped."""

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        params = list(parameters)
        self._reduce(params)
        return super().clip_grad_norm_(params, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[nn.Parameter], clip_value: float) -> None:
        params = list(parameters)
        self._reduce(params)
        super().clip_grad_value_(params, clip_value)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        """Step, and leave the graph cut (the run of the step's graph) to `zero_grad`.

        A graph cut materializes every live tensor it computed: cut here, while the
        gradients are still held, the graph would write each parameter's gradient (and the
        views of it) out as a result, which raw torch-xla's loop never does (its cut comes at
        the next batch, after `zero_grad` released them). So the cut waits for `zero_grad`;
        where none comes through the prepared optimizer, the prepared loader's next batch
        cuts, and failing both, the next optimizer step cuts first (a graph never spans more
        than two steps)."""
        if self._cut_pending:
            self._cut()
        self._reduce(p for g in optimizer.param_groups for p in g["params"])
        stepped = super().optimizer_step(optimizer, precision)
        self._reduced.clear()
        self._cut_pending = True
        return stepped

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)
        if self._cut_pending:
            self._cut()

    def _cut(self) -> None:
        """Run the step's graph (the accumulation boundary)..."""
        self._cut_pending = False
        self._xla.sync()
        # ...and tell torch-xla's loader so, or its next batch cuts an empty graph again (the
        # flag its PerDeviceLoader reads, which torch-xla's own step tracer sets)
        self._profiler.set_tracer_marked_step(True)

    # -- state: on the host, so that every engine reads it -------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        self._xla.sync()
        return _to_host(super().model_state_dict(model))

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        self._xla.sync()
        return _to_host(optimizer.state_dict())

    def gradients_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        self._xla.sync()
        return super().gradients_state(model)

    def rng_state(self) -> dict[str, Any]:
        import torch_xla.core.xla_model as xm

        return {"xm_seed": xm.get_rng_state(self.device)}  # accelerate's key

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        if "xm_seed" in state:
            import torch_xla.core.xla_model as xm

            xm.set_rng_state(int(state["xm_seed"]), self.device)


class XLAStrategy(XLABase):
    """One XLA device per process: gradients all-reduced once per optimizer step over the
    replicas (not in the backward: accumulation needs no `no_sync`)."""

    name = "xla"

    @classmethod
    def placement(cls, environ: Mapping[str, str], *, named: bool) -> ProcessInfo | None:
        """torch-xla's place for this process, when the run names "xla" or names no strategy
        and an XLA device is there (`xla_requested`)."""
        return _placed(spmd=False) if named or xla_requested(environ) else None

    def _reduce(self, parameters: Iterable[nn.Parameter]) -> None:
        """All-reduce (average) the gradients of `parameters` not reduced yet this step."""
        todo = [p for p in parameters if p.grad is not None and id(p) not in self._reduced]
        self._reduced.update(id(p) for p in todo)
        if todo and self.info.num_processes > 1:
            import torch_xla.core.xla_model as xm

            grads = [p.grad for p in todo]
            xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0 / self.info.num_processes)


class XLASpmdStrategy(XLABase):
    """One process over every XLA device of its host (SPMD): parameters replicated, each batch
    sharded along its first dimension over a 1-D "data" mesh; the compiler adds the gradient
    all-reduce. A batch whose first dimension the devices do not divide is replicated."""

    name = "xla_spmd"

    @classmethod
    def placement(cls, environ: Mapping[str, str], *, named: bool) -> ProcessInfo | None:
        """torch-xla's place for this process in SPMD mode, when the run names "xla_spmd"."""
        return _placed(spmd=True) if named else None

    def __init__(self, info: ProcessInfo, *, clip_norm: float | None = None) -> None:
        super().__init__(info, clip_norm=clip_norm)
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        if not xr.is_spmd():
            raise RuntimeError(
                "strategy 'xla_spmd' needs torch-xla's SPMD mode, which must be on before the "
                "first XLA tensor: create the Accelerator(strategy='xla_spmd') first, or call "
                "torch_xla.runtime.use_spmd() at the start of the script."
            )
        count = xr.global_runtime_device_count()
        self.mesh = xs.Mesh(np.arange(count), (count,), ("data",))

    def _input_sharding(self) -> Any:
        return _BatchSharding(self.mesh)

    # _reduce: XLABase's nothing, as the compiled SPMD step reduces the gradients itself


class _BatchSharding:
    """For ParallelLoader: each tensor's sharding over the "data" mesh (first dimension)."""

    minibatch = False

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh

    def xla_spec(self, tensor: torch.Tensor) -> Any:
        import torch_xla.distributed.spmd as xs

        spec = _batch_spec(tensor, self.mesh)
        return None if spec is None else xs.ShardingSpec(self.mesh, spec).xla_spec(tensor)


def _batch_spec(tensor: torch.Tensor, mesh: Any) -> tuple[Any, ...] | None:
    devices = mesh.size()
    if tensor.dim() == 0 or tensor.shape[0] % devices:
        return None
    return ("data",) + (None,) * (tensor.dim() - 1)


class _Once:
    """An iterator as the iterable ParallelLoader reads from its thread."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[Any]:
        return self._batches


def _map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return type(value)({k: _map_tensors(fn, v) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(fn, v) for v in value)
    return value


def _to_host(value: Any) -> Any:
    return _map_tensors(lambda t: t.detach().cpu(), value)


def _repoint(
    optimizer: torch.optim.Optimizer, moved: dict[int, nn.Parameter], device: torch.device
) -> None:
    """Point `optimizer` at the moved parameters (`moved`: id of the old one -> new one) and
    move its state there; a parameter of no prepared model is refused, naming the fix."""
    state = optimizer.state
    for group in optimizer.param_groups:
        params: Sequence[nn.Parameter] = group["params"]
        new = []
        for p in params:
            if p.device.type == "xla":
                new.append(p)
                continue
            if id(p) not in moved:
                raise ValueError(
                    f"the optimizer holds a parameter of shape {tuple(p.shape)} on {p.device} that "
                    f"no model of this prepare() call has: moving a model to an XLA device makes "
                    f"new parameters, so pass the model together with its optimizer to one "
                    f"prepare() call (or make the optimizer from the prepared model)."
                )
            q = moved[id(p)]
            if p in state:
                state[q] = _map_tensors(lambda t: t.to(device), state.pop(p))
            new.append(q)
        group["params"] = new


def _build(request: StrategyRequest) -> XLAStrategy:
    _refuse_fp16(request, "xla")
    return XLAStrategy(request.info, clip_norm=request.clip_norm)


def _build_spmd(request: StrategyRequest) -> XLASpmdStrategy:
    _refuse_fp16(request, "xla_spmd")
    if request.info.num_processes > 1:
        raise ValueError(
            f"strategy 'xla_spmd' drives every device of a host from one process; this run has "
            f"{request.info.num_processes} processes. Launch one process per host, or use 'xla'."
        )
    return XLASpmdStrategy(request.info, clip_norm=request.clip_norm)


def _refuse_fp16(request: StrategyRequest, name: str) -> None:
    if request.mixed_precision == "fp16":
        raise ValueError(
            f"mixed_precision='fp16' is not supported by strategy {name!r}: TPUs compute in "
            f"bfloat16; use mixed_precision='bf16'."
        )


register_strategy(
    XLAStrategy.name,
    _build,
    claims=lambda request: 30 if request.info.device.type == "xla" else None,
    kind=XLAStrategy,
)
register_strategy(XLASpmdStrategy.name, _build_spmd, kind=XLASpmdStrategy)
