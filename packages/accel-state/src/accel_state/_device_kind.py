"""Device kinds as registered components: the base class every kind's entry is, and the
registry that holds one entry per kind. The lookups are in ``_devices``, which loads the
built-in kinds (``_device_kinds``) first.

The whole design:

Everything that differs between device kinds (presence, the device of a local rank, selecting
and synchronizing it, its RNG state, memory queries, the default process-group backend, the
autocast dtypes, whether host memory can be pinned for it) is a method or an attribute of its
entry; callers ask ``device_entry(device)`` instead of comparing ``device.type`` with a name.
Where ``torch.accelerator`` has the operation and the entry's kind is torch's current
accelerator, the entry calls it; otherwise the kind's device module (``torch.cuda``, ...).
The concrete kinds live in ``_device_kinds``; a new kind is one subclass registered there (or
anywhere, with `register_device_kind`). Looking up a kind imports nothing and initializes no
device: presence is computed on first use and cached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch

from accel_state._enums import MULTI_DEVICE_TYPES, DistributedType

_Kind = TypeVar("_Kind", bound="type[DeviceKind]")


class DeviceKind:
    """One kind of device (``name`` is its ``torch.device.type``), with torch's defaults.

    The defaults ask ``torch.accelerator`` where this kind is the current accelerator, else
    ``torch.get_device_module(name)``; a kind overrides only what differs for it. Queries a kind
    has no answer for return None, and operations it has no use for do nothing.
    """

    name: ClassVar[str] = ""
    is_host: ClassVar[bool] = False
    """The device is the host's memory (tensors there are plain CPU tensors)."""
    async_copies: ClassVar[bool] = False
    """Host memory can be pinned for this kind and copies to it overlap compute on side
    streams (offload prefetch, non-blocking batch moves, pinned staging buffers)."""
    selects_device: ClassVar[bool] = True
    """A process selects its device (``set_device``) before creating the process group."""
    default_backend_name: ClassVar[str | None] = None
    """The process-group backend a run on this kind uses when none is asked; None asks torch
    (``torch.distributed.get_default_backend_for_device``)."""
    rendezvous_init_method: ClassVar[str | None] = None
    """An ``init_method`` the backend meets through without an address (``xla://``), or None."""
    autocast_dtypes: ClassVar[tuple[torch.dtype, ...]] = ()
    """The lower-precision dtypes ``torch.autocast`` takes on this kind."""
    records_memory_history: ClassVar[bool] = False
    """The allocator keeps a history of its allocations that a snapshot can record (an OOM
    snapshot)."""
    ring_attention: ClassVar[bool] = False
    """torch's context-parallel ring attention runs here (it needs CUDA's SDPA kernels)."""
    multi_process_type: ClassVar[DistributedType | None] = None
    """The distributed type of a run of several processes on this kind (None: the table in
    ``_enums``, then MULTI_GPU as accelerate does)."""

    def __init__(self) -> None:
        self._present: bool | None = None

    def __repr__(self) -> str:
        return f"<device kind {self.name!r}>"

    # presence -----------------------------------------------------------------------------
    def is_available(self) -> bool:
        """Whether a device of this kind is usable here; computed once, without a device init
        where torch allows it."""
        if self._present is None:
            self._present = self._probe()
        return self._present

    def _probe(self) -> bool:
        module = self.module()
        if module is None:
            return False
        try:
            return bool(module.is_available())
        except Exception:
            return False

    def device_count(self) -> int:
        acc = self._accelerator_op("device_count")
        if acc is not None:
            return int(acc())
        module = self.module()
        return int(module.device_count()) if module is not None else 0

    def module(self) -> Any:
        """``torch.<name>`` (torch's device module for this kind), or None where torch has none."""
        try:
            return torch.get_device_module(self.name)
        except (RuntimeError, AttributeError):
            return None

    def _is_current_accelerator(self) -> bool:
        acc = getattr(torch, "accelerator", None)
        if acc is None or not acc.is_available():
            return False
        current = acc.current_accelerator()
        return current is not None and current.type == self.name

    def _accelerator_op(self, op: str) -> Callable[..., Any] | None:
        """``torch.accelerator.<op>`` when torch has it and this kind is its accelerator."""
        acc = getattr(torch, "accelerator", None)
        found = getattr(acc, op, None)
        return found if found is not None and self._is_current_accelerator() else None

    def _op(self, op: str) -> Callable[..., Any] | None:
        """The operation from torch.accelerator, else from the device module, else None."""
        found = self._accelerator_op(op)
        if found is None:
            found = getattr(self.module(), op, None)
        return found

    # devices ------------------------------------------------------------------------------
    def device_for_rank(self, local_rank: int, world_size: int) -> torch.device:
        """The device of local rank ``local_rank``: that index in a world of several
        processes, the current device of a single process."""
        if world_size > 1:
            return torch.device(self.name, local_rank)
        return torch.device(self.name, self._current_index())

    def _current_index(self) -> int:
        acc = self._accelerator_op("current_device_index")
        if acc is not None:
            return int(acc())
        return int(self.module().current_device())

    def set_device(self, device: torch.device) -> None:
        """Make ``device`` this process's (or thread's) current device."""
        if not self.selects_device:
            return
        acc = self._accelerator_op("set_device_index")
        if acc is not None:
            acc(device.index if device.index is not None else self._current_index())
        else:
            self.module().set_device(device)

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for the work queued on ``device`` (the current one when None)."""
        found = self._op("synchronize")
        if found is not None:
            found(device)

    # random numbers -----------------------------------------------------------------------
    @property
    def rng_key(self) -> str:
        """The key of this kind's generators in a ``random_states_<rank>.pkl`` file."""
        return f"torch_{self.name}_manual_seed"

    def manual_seed_all(self, seed: int) -> None:
        found = getattr(self.module(), "manual_seed_all", None)
        if found is not None:
            found(seed)

    def get_rng_state(self) -> torch.Tensor:
        """The current device's generator state (what a broadcast synchronizes)."""
        return self.module().get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.module().set_rng_state(state)

    def get_rng_state_all(self) -> Any:
        """Every device's generator state, as a checkpoint stores it under `rng_key`."""
        return self.module().get_rng_state_all()

    def set_rng_state_all(self, state: Any) -> None:
        self.module().set_rng_state_all(state)

    # memory -------------------------------------------------------------------------------
    def _memory(self, op: str, device: torch.device | None) -> int | None:
        found = self._op(op)
        if found is None:
            return None
        try:
            return int(found(device))
        except (RuntimeError, AssertionError, AttributeError, TypeError):
            return None

    def memory_allocated(self, device: torch.device | None = None) -> int | None:
        """Bytes held by tensors on ``device`` now, or None where this kind does not count."""
        return self._memory("memory_allocated", device)

    def max_memory_allocated(self, device: torch.device | None = None) -> int | None:
        """The peak of `memory_allocated` since the last `reset_peak_memory_stats`, or None."""
        return self._memory("max_memory_allocated", device)

    def max_memory_reserved(self, device: torch.device | None = None) -> int | None:
        """The peak of the bytes the caching allocator reserved, or None without one."""
        return self._memory("max_memory_reserved", device)

    def reset_peak_memory_stats(self, device: torch.device | None = None) -> None:
        found = self._op("reset_peak_memory_stats")
        if found is not None:
            found(device)

    def empty_cache(self) -> None:
        """Return the allocator's cached, unused blocks to the device (a no-op without one)."""
        found = self._op("empty_cache")
        if found is not None:
            found()

    def total_memory(self, device: torch.device | None = None) -> int | None:
        """The device's memory in bytes, or None where this kind does not say."""
        props = getattr(self.module(), "get_device_properties", None)
        if props is None:
            return None
        try:
            return int(props(device).total_memory)
        except (RuntimeError, AssertionError, AttributeError, TypeError):
            return None

    def device_name(self, device: torch.device) -> str:
        """The product name of ``device`` where this kind reports one, else the kind's name."""
        return self.name

    def tf32_matmul(self) -> bool:
        """Whether float32 matmuls run in TF32 here (a CUDA setting)."""
        return False

    # processes ----------------------------------------------------------------------------
    def default_backend(self) -> str:
        """The process-group backend for a run on this kind when none is asked."""
        if self.default_backend_name is not None:
            return self.default_backend_name
        import torch.distributed as dist

        return dist.get_default_backend_for_device(torch.device(self.name))

    def distributed_type(self, world_size: int) -> DistributedType:
        """accelerate's `DistributedType` of a run of ``world_size`` processes on this kind."""
        if world_size <= 1:
            return DistributedType.NO
        if self.multi_process_type is not None:
            return self.multi_process_type
        return MULTI_DEVICE_TYPES.get(self.name, DistributedType.MULTI_GPU)


class _OtherKind(DeviceKind):
    """A kind nobody registered (``mlu``, ``musa``, a PrivateUse1 backend): torch's defaults."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name  # type: ignore[misc]


_REGISTRY: dict[str, DeviceKind] = {}
_OTHERS: dict[str, DeviceKind] = {}


def register_device_kind(kind: _Kind) -> _Kind:
    """Register a `DeviceKind` subclass under its ``name`` (a class decorator); a later
    registration of the same name replaces the earlier one."""
    if not kind.name:
        raise ValueError(f"{kind.__name__} has no `name`: set it to its torch.device type.")
    _REGISTRY[kind.name] = kind()
    return kind


def unregister_device_kind(name: str) -> None:
    """Remove a registered kind (for tests that register a fake one)."""
    _REGISTRY.pop(name, None)
