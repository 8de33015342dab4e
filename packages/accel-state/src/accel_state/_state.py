"""`PartialState`: the process topology, built once per process and immutable afterwards."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import sys
import threading
import warnings
from typing import Any, ClassVar

import torch

from accel_state._control import ProcessControl
from accel_state._devices import device_entry
from accel_state._enums import DistributedType
from accel_state._environment import (
    DEFAULT_MASTER_PORT,
    ENV_ACCEL_CONFIG,
    ENV_ACCELERATE_DEBUG_MODE,
    ENV_DEBUG_MODE,
    LaunchInfo,
    detect_launch,
    device_override,
    launch_config,
)
from accel_state._threads import declare_shared_state, set_shared_state, state_is_per_thread

_KNOWN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl", "hccl", "cncl", "mccl")


@dataclasses.dataclass
class InitProcessGroupKwargs:
    """Arguments for creating the process group.

    `backend`, `init_method` and `timeout` are accelerate's fields, in its order (positional
    arguments mean what they mean there; the record may be assigned after creation, as
    accelerate's may). `backend` None picks the device's backend (nccl on CUDA, gloo on CPU);
    `timeout` accepts a `datetime.timedelta` or a number of seconds, None leaving torch's default.
    """

    backend: str | None = None
    init_method: str | None = None
    timeout: datetime.timedelta | float | None = None
    _: dataclasses.KW_ONLY
    # Further keywords of `torch.distributed.init_process_group` (pg_options, device_id, ...),
    # as accelerate's `PartialState(**kwargs)` passes them through.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.timeout is not None and not isinstance(self.timeout, datetime.timedelta):
            if (
                isinstance(self.timeout, bool)
                or not isinstance(self.timeout, (int, float))
                or self.timeout <= 0
            ):
                raise ValueError(
                    f"InitProcessGroupKwargs.timeout={self.timeout!r}: expected a positive number "
                    f"of seconds or a datetime.timedelta."
                )
            self.timeout = datetime.timedelta(seconds=self.timeout)
        unknown = sorted(set(self.extra) - _passable_init_keywords())
        if unknown:
            raise TypeError(
                f"init_process_group does not take {unknown}; it takes "
                f"{sorted(_passable_init_keywords() | {'backend', 'init_method', 'timeout'})}. "
                f"Remove them, or pass the rank and world size as num_processes / process_index."
            )

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from the defaults, as accelerate's handlers give them."""
        given = {"backend": self.backend, "init_method": self.init_method, "timeout": self.timeout}
        return {k: v for k, v in given.items() if v is not None} | dict(self.extra)

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any]) -> InitProcessGroupKwargs:
        """Split `PartialState(**kwargs)`'s keywords into this record (unknown names refused)."""
        known = {k: keywords.pop(k) for k in ("backend", "init_method", "timeout") if k in keywords}
        return cls(**known, extra=keywords)


@functools.cache
def _passable_init_keywords() -> frozenset[str]:
    """Keywords of `init_process_group` a caller may pass through (accel sets the rest)."""
    import inspect

    import torch.distributed as dist

    if not dist.is_available():
        return frozenset()
    names = set(inspect.signature(dist.init_process_group).parameters)
    return frozenset(names - {"backend", "init_method", "timeout", "rank", "world_size"})


@dataclasses.dataclass(frozen=True)
class Topology:
    """Everything PartialState knows, as one immutable record."""

    launcher: str
    process_index: int
    num_processes: int
    local_process_index: int
    local_num_processes: int
    node_rank: int
    device: torch.device
    backend: str | None
    distributed_type: DistributedType


@functools.cache
def resolved_launch_config() -> dict[str, Any]:
    """The configuration `accel launch` resolved for this worker ({} outside `accel launch`)."""
    raw = launch_config()
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{ENV_ACCEL_CONFIG} does not hold valid JSON ({err}). It is written by `accel launch`; "
            f"unset it when starting the script another way."
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{ENV_ACCEL_CONFIG} must hold a JSON object, got {type(value).__name__}.")
    return value


def available_backends() -> list[str]:
    import torch.distributed as dist

    if not dist.is_available():
        return []
    return [b for b in _KNOWN_BACKENDS if _backend_available(b)]


def _backend_available(name: str) -> bool:
    import torch.distributed as dist

    try:
        return bool(dist.is_backend_available(name))
    except Exception:
        return False


def _accelerator_type() -> str | None:
    """The accelerator torch would use, or None when there is none (a CPU-only machine)."""
    from accel_state._devices import accelerator_entry

    entry = accelerator_entry()
    return None if entry is None else entry.name


def _pick_device(cpu: bool, local_rank: int, world_size: int) -> torch.device:
    named = device_override()
    if named is not None:
        try:
            return torch.device(named)
        except RuntimeError:
            raise ValueError(
                f"ACCELERATE_TORCH_DEVICE={named!r} is not a torch device; write one such as "
                f"'cuda:0', 'xpu' or 'cpu', or unset it to let accel pick the device."
            ) from None
    kind = None if cpu else _accelerator_type()
    if kind is None:
        return torch.device("cpu")
    entry = device_entry(kind)
    count = entry.device_count()
    if local_rank >= count:
        raise RuntimeError(
            f"Local rank {local_rank} has no {kind} device: only {count} are visible. Launch at most "
            f"{count} processes per node, fix CUDA_VISIBLE_DEVICES (or --gpu_ids), or pass cpu=True."
        )
    return entry.device_for_rank(local_rank, world_size)


def _pick_backend(device: torch.device, requested: str | None) -> str:
    if requested is None:
        requested = device_entry(device).default_backend()
    if not _backend_available(requested):
        raise ValueError(
            f"backend={requested!r} is not available in this torch build; available: "
            f"{available_backends()}. Pick one of those (gloo works on every CPU)."
        )
    return requested


class _SharedStateView:
    """`PartialState._shared_state`, the name accelerate's tests read: empty before the first
    PartialState (nothing initialized), the topology after. A copy; writing to it changes
    nothing."""

    def __get__(self, obj: object, owner: type | None = None) -> dict[str, Any]:
        topo = PartialState._topology
        return {} if topo is None else {"topology": topo}


class PartialState(ProcessControl):
    """The process topology: rank, world size, device, backend; made once per process.

    Sources, strongest first: explicit arguments (`device`: an XLA device, which the caller
    reads from torch-xla's runtime, makes the run's type XLA), the launcher's environment
    (torchrun, SLURM, Open MPI, MPICH / Intel MPI), the configuration of `accel launch`,
    defaults. Every instance
    shares one topology; it cannot be changed after creation (``PartialState._reset_state()``
    starts over, for tests). Creating the first instance of a multi-process run creates the
    process group; importing accel-state does nothing. Where torch-xla runs a process's
    replicas as threads, each thread has its own topology and notes (`split_state_per_thread`).
    """

    _topology: ClassVar[Topology | None] = None
    _notes: ClassVar[dict[str, Any]] = {}
    _shared_state = _SharedStateView()

    def __init__(
        self,
        cpu: bool | None = None,
        *,
        backend: str | None = None,
        init_process_group_kwargs: InitProcessGroupKwargs | None = None,
        num_processes: int | None = None,
        process_index: int | None = None,
        local_process_index: int | None = None,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.pop("_use_sagemaker_dp", None):
            raise NotImplementedError(
                "SageMaker's data-parallel library (_use_sagemaker_dp=True) is not supported by "
                "accel; launch with torchrun or `accel launch` on the SageMaker instance instead."
            )
        if kwargs:  # accelerate passes further keywords through to init_process_group
            passed = InitProcessGroupKwargs.from_keywords(kwargs)
            if init_process_group_kwargs is not None:
                merged = init_process_group_kwargs.to_kwargs() | passed.to_kwargs()
                passed = InitProcessGroupKwargs.from_keywords(merged)
            init_process_group_kwargs = passed
        if PartialState._topology is None:
            topology = _build_topology(
                cpu=cpu,
                backend=backend,
                pg_kwargs=init_process_group_kwargs or InitProcessGroupKwargs(),
                num_processes=num_processes,
                process_index=process_index,
                local_process_index=local_process_index,
                device=device,
            )
            set_shared_state(PartialState, "_topology", topology)
        else:
            self._check_consistent(cpu=cpu, backend=backend, num_processes=num_processes)

    def _check_consistent(self, **asked: Any) -> None:
        topo = self.topology
        actual = {
            "cpu": device_entry(topo.device).is_host,
            "backend": topo.backend,
            "num_processes": topo.num_processes,
        }
        for key, value in asked.items():
            if value is not None and value != actual[key] and not (key == "cpu" and value is False):
                warnings.warn(
                    f"PartialState was already created with {key}={actual[key]!r}; the new value "
                    f"{value!r} is ignored (the topology is fixed once created).",
                    stacklevel=3,
                )

    def __setattr__(self, name: str, value: Any) -> None:
        """The topology is immutable; other names are the caller's own notes, shared by every
        instance (as accelerate's states share theirs) until the next `_reset_state`."""
        if hasattr(type(self), name):
            raise AttributeError(
                f"PartialState is immutable (tried to set {name!r}). Pass the value when "
                f"creating the first PartialState, or call PartialState._reset_state() in tests."
            )
        PartialState._notes[name] = value

    def __getattr__(self, name: str) -> Any:
        notes = PartialState._notes
        if name in notes:
            return notes[name]
        if name == "debug":  # accelerate's flag: collectives check shapes first
            return debug_mode()
        cls = type(self).__name__
        if PartialState._topology is None and hasattr(type(self), name):  # a property failed
            raise AttributeError(
                f"`{cls}` object has no attribute `{name}`. This happens if "
                f"`{cls}._reset_state()` was called and an `Accelerator` or `PartialState` was "
                f"not made again afterwards; create one before using the state."
            )
        raise AttributeError(f"{cls!r} object has no attribute {name!r}")

    @classmethod
    def _reset_state(cls, destroy_process_group: bool = False) -> None:
        """Forget the topology (tests). Optionally destroy the process group too."""
        set_shared_state(PartialState, "_topology", None)
        set_shared_state(PartialState, "_notes", {})
        resolved_launch_config.cache_clear()
        if destroy_process_group:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()

    @property
    def initialized(self) -> bool:
        return PartialState._topology is not None

    @property
    def topology(self) -> Topology:
        topo = PartialState._topology
        if topo is None:  # reset after this instance was made
            raise AttributeError("topology")  # __getattr__ words it, naming the attribute
        return topo

    # The familiar attributes.
    device = property(lambda self: self.topology.device)
    distributed_type = property(lambda self: self.topology.distributed_type)
    num_processes = property(lambda self: self.topology.num_processes)
    process_index = property(lambda self: self.topology.process_index)
    local_process_index = property(lambda self: self.topology.local_process_index)
    local_num_processes = property(lambda self: self.topology.local_num_processes)
    node_rank = property(lambda self: self.topology.node_rank)
    backend = property(lambda self: self.topology.backend)
    launcher = property(lambda self: self.topology.launcher)
    use_distributed = property(lambda self: self.topology.num_processes > 1)
    is_main_process = property(lambda self: self.topology.process_index == 0)
    is_local_main_process = property(lambda self: self.topology.local_process_index == 0)
    is_last_process = property(
        lambda self: self.topology.process_index == self.topology.num_processes - 1
    )
    default_device = property(lambda self: self.topology.device)

    def __repr__(self) -> str:
        t = self.topology
        return (
            f"Distributed environment: {t.distributed_type}  Backend: {t.backend}\n"
            f"Num processes: {t.num_processes}\nProcess index: {t.process_index}\n"
            f"Local process index: {t.local_process_index}\nDevice: {t.device}\n"
        )

    def destroy_process_group(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


declare_shared_state(PartialState, "_topology", lambda: None)
declare_shared_state(PartialState, "_notes", dict)


def _merge_launch(
    info: LaunchInfo, num_processes: int | None, process_index: int | None, local_index: int | None
) -> LaunchInfo:
    changes = {}
    if num_processes is not None:
        changes["world_size"] = num_processes
    if process_index is not None:
        changes["rank"] = process_index
    if local_index is not None:
        changes["local_rank"] = local_index
    return dataclasses.replace(info, **changes) if changes else info


def _validate(info: LaunchInfo) -> None:
    if info.world_size < 1:
        raise ValueError(f"num_processes={info.world_size} ({info.launcher}): must be at least 1.")
    if not 0 <= info.rank < info.world_size:
        raise ValueError(
            f"Process rank {info.rank} is outside the world of {info.world_size} processes "
            f"(from {info.launcher}); ranks run from 0 to {info.world_size - 1}. Check the "
            f"launcher's RANK / WORLD_SIZE (or SLURM_PROCID / SLURM_NTASKS)."
        )
    if info.local_rank < 0:
        raise ValueError(f"Local rank {info.local_rank} is negative.")


def _build_topology(
    cpu: bool | None,
    backend: str | None,
    pg_kwargs: InitProcessGroupKwargs,
    num_processes: int | None,
    process_index: int | None,
    local_process_index: int | None,
    device: torch.device | str | None = None,
) -> Topology:
    launched = resolved_launch_config()
    given = None if device is None else torch.device(device)
    if cpu is None:
        cpu = bool(launched.get("cpu", False))
    elif "cpu" in launched and bool(launched["cpu"]) != cpu:
        warnings.warn(
            f"The code asks cpu={cpu} but `accel launch` was configured with cpu={launched['cpu']}; "
            f"using the code's value.",
            stacklevel=4,
        )
    backend = backend or pg_kwargs.backend or launched.get("backend")

    import torch.distributed as dist

    # Replica threads share their process's group, whose rank is the first thread's: each
    # thread's rank is its own (given by the caller, from torch-xla's runtime).
    if dist.is_available() and dist.is_initialized() and not state_is_per_thread():
        # The user (or a framework) made the process group: adopt it.
        info = detect_launch()
        info = dataclasses.replace(info, rank=dist.get_rank(), world_size=dist.get_world_size())
        device = given or _pick_device(cpu, info.local_rank, info.world_size)
        return _topology(info, device, str(dist.get_backend()))

    info = _merge_launch(detect_launch(), num_processes, process_index, local_process_index)
    _validate(info)
    device = given or _pick_device(cpu, info.local_rank, info.world_size)
    if info.world_size == 1:
        return _topology(info, device, _pick_backend(device, backend) if backend else None)

    chosen = _pick_backend(device, backend)
    init_method = pg_kwargs.init_method
    entry = device_entry(device)
    if init_method is None:  # xla's backend meets through its runtime: no address
        init_method = entry.rendezvous_init_method
    if init_method is None:
        if not info.master_addr:
            raise RuntimeError(
                f"A world of {info.world_size} processes (from {info.launcher}) needs a rendezvous "
                f"address, and MASTER_ADDR is not set. Launch with `accel launch` or torchrun, or "
                f"export MASTER_ADDR (and MASTER_PORT) on every process."
            )
        init_method = f"tcp://{info.master_addr}:{info.master_port or DEFAULT_MASTER_PORT}"
    entry.set_device(device)
    extra = dict(pg_kwargs.extra)
    if pg_kwargs.timeout is not None:
        extra["timeout"] = pg_kwargs.timeout
    if "store" in extra:  # the caller's own store is the rendezvous
        init_method = None
    elif pg_kwargs.init_method is None and info.restart_count is not None and info.agent_store:
        # On the store of torchrun's agent, which outlives the workers: a fresh key space per
        # restart attempt (see _store). Without it, rank 0 hosts a new store each attempt;
        # no prefix then, as agents of an elastic run count their restarts apart.
        from torch.distributed.constants import default_pg_timeout

        from accel_state._store import attempt_store

        timeout = pg_kwargs.timeout or default_pg_timeout
        extra["store"] = attempt_store(info, timeout)  # type: ignore[arg-type]
        init_method = None
    _init_process_group(
        backend=chosen,
        init_method=init_method,
        rank=info.rank,
        world_size=info.world_size,
        **extra,
    )
    return _topology(info, device, chosen)


_GROUP_LOCK = threading.Lock()


def _init_process_group(**kwargs: Any) -> None:
    """torch.distributed's default group, one per process: where the replicas are threads
    (state per thread), the first thread makes it and the others use it. torch-xla's `xla`
    backend runs each collective on the calling thread's device; `dist.get_rank()` answers
    the first thread's rank there, each thread's own is its state's `process_index`."""
    import torch.distributed as dist

    if not state_is_per_thread():
        dist.init_process_group(**kwargs)
        _close_group_at_exit()
        return
    with _GROUP_LOCK:
        if not dist.is_initialized():
            dist.init_process_group(**kwargs)


@functools.cache
def _close_group_at_exit() -> None:
    """Destroy a gloo default group at a normal interpreter exit (once registered per process).

    A script that never calls `end_training()` leaves gloo's worker threads running into the
    interpreter's finalization, where the process can end with "terminate called without an
    active exception" (SIGABRT): a finished worker reported failed, and torchrun restarted it
    (seen in an elastic run on two hosts). Destroyed here while the interpreter is whole, the
    group stops cleanly. Not after an uncaught exception (the peers may still be in a
    collective with this process), and not for NCCL, whose teardown is left to the program."""
    import atexit

    atexit.register(_destroy_gloo_group)


def _destroy_gloo_group() -> None:
    import torch.distributed as dist

    if getattr(sys, "last_value", None) is not None:  # an uncaught exception ends the run
        return
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


def _topology(info: LaunchInfo, device: torch.device, backend: str | None) -> Topology:
    dtype = device_entry(device).distributed_type(info.world_size)
    return Topology(
        launcher=info.launcher,
        process_index=info.rank,
        num_processes=info.world_size,
        local_process_index=info.local_rank,
        local_num_processes=info.local_world_size,
        node_rank=info.node_rank,
        device=device,
        backend=backend,
        distributed_type=dtype,
    )


def debug_mode() -> bool:
    """Whether collectives check shapes across processes first: `PartialState().debug` where
    the code set it, else `ACCEL_DEBUG_MODE` (or accelerate's `ACCELERATE_DEBUG_MODE`)."""
    chosen = PartialState._notes.get("debug")
    if chosen is not None:
        return bool(chosen)
    names = (ENV_DEBUG_MODE, ENV_ACCELERATE_DEBUG_MODE)
    return any(os.environ.get(n, "").strip().lower() in ("1", "true", "yes", "on") for n in names)
