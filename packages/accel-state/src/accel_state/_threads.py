"""The run's shared state, kept per thread where a process runs several replicas as threads.

The state every instance of PartialState (and of the umbrella's AcceleratorState and
GradientState) shares is held in class attributes, one value for the process, so that a data
loader's or the hang doctor's thread sees the state its process made, and reading it costs a
plain attribute read. torch-xla runs the replicas of a process as threads, one per device, where
a process drives several devices without SPMD (`xmp.spawn` on TPU v2/v3, or on XLA's CPU device
with CPU_NUM_DEVICES > 1): there each thread is a process of its own to the training loop, with
its own device and rank. `split_state_per_thread()` (the Accelerator calls it when torch-xla's
runtime says so) turns every declared attribute into one slot per thread, each thread starting
from a fresh value. A process that never calls it keeps its state as it was, at no cost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_DECLARED: list[tuple[type, str, Callable[[], Any]]] = []
_SPLIT = False


class _PerThread:
    """A declared attribute after the split: each thread reads what it set (a fresh value from
    `fresh()` until then)."""

    __slots__ = ("_fresh", "_local")

    def __init__(self, fresh: Callable[[], Any]) -> None:
        self._fresh = fresh
        self._local = threading.local()

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        try:
            return self._local.value
        except AttributeError:
            value = self._local.value = self._fresh()
            return value

    def set(self, value: Any) -> None:
        self._local.value = value


def declare_shared_state(owner: type, name: str, fresh: Callable[[], Any]) -> None:
    """Declare the class attribute `owner.name` part of the run's shared state: one value per
    process, or per thread once the state is split (each thread then starts from `fresh()`).
    Write it with `set_shared_state` only; reading stays a plain attribute read."""
    with _LOCK:
        _DECLARED.append((owner, name, fresh))
        if _SPLIT:
            _install(owner, name, fresh)


def set_shared_state(owner: type, name: str, value: Any) -> None:
    """Assign the declared attribute `owner.name`: this thread's value once the state is split,
    the process's before (a plain assignment would replace the per-thread slot)."""
    with _LOCK:
        slot = owner.__dict__.get(name)
        if isinstance(slot, _PerThread):
            slot.set(value)
        else:
            setattr(owner, name, value)


def split_state_per_thread() -> None:
    """From now on each thread of this process holds its own shared state (topology, notes,
    the Accelerator's records), starting empty: for a process whose replicas are threads. The
    process's values until now are not carried over. Idempotent; there is no way back."""
    global _SPLIT
    with _LOCK:
        _SPLIT = True
        for owner, name, fresh in _DECLARED:
            _install(owner, name, fresh)


def state_is_per_thread() -> bool:
    """Whether `split_state_per_thread()` ran in this process."""
    return _SPLIT


def _install(owner: type, name: str, fresh: Callable[[], Any]) -> None:
    if not isinstance(owner.__dict__.get(name), _PerThread):
        setattr(owner, name, _PerThread(fresh))
