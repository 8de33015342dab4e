"""Seeding and synchronizing random number generators."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from typing import Any

import torch

from accel_state._devices import accelerator_entry, device_entry
from accel_state._enums import RNGType


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def set_seed(
    seed: int,
    device_specific: bool = False,
    deterministic: bool = False,
    *,
    process_index: int | None = None,
) -> None:
    """Seed python, numpy (when installed), torch, every accelerator and, on an XLA device,
    XLA's generator.

    With ``device_specific`` the rank is added to the seed, so processes draw different numbers
    (data augmentation); the rank is `process_index`, or the current PartialState's.
    ``deterministic`` also asks torch for deterministic algorithms.
    """
    if device_specific:
        if process_index is None:
            from accel_state._state import PartialState

            process_index = PartialState().process_index
        seed += process_index
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device lazily
    entry = accelerator_entry()
    if entry is not None:
        entry.manual_seed_all(seed)
    xla = device_entry("xla")
    if xla.is_available():  # XLA's generator is its own (accelerate: xm.set_rng_state)
        xla.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _broadcast_state(state: torch.Tensor, device: torch.device) -> torch.Tensor:
    import torch.distributed as dist

    moved = state.to(device)
    dist.broadcast(moved, src=0)
    return moved.cpu()


def _comm_device() -> torch.device:
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if backend == "gloo":
        return torch.device("cpu")
    from accel_state._state import PartialState

    return PartialState().device


_DEVICE_KINDS = frozenset(RNGType) - {
    RNGType.TORCH, RNGType.GENERATOR, RNGType.PYTHON, RNGType.NUMPY, RNGType.XLA
}  # fmt: skip


def synchronize_rng_state(
    rng_type: str | RNGType, generator: torch.Generator | None = None
) -> None:
    """Give every process the main process's state of one generator kind."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    kind = RNGType(rng_type)
    device = _comm_device()
    if kind is RNGType.TORCH:
        torch.set_rng_state(_broadcast_state(torch.get_rng_state(), device))
    elif kind is RNGType.XLA:
        raise ValueError(
            "synchronize_rng_state('xla') is not supported by accel (on XLA, set_seed seeds "
            "XLA's generator on every process); use the generator of the device this run has "
            "('cuda', 'xpu', ...) or 'torch'."
        )
    elif kind in _DEVICE_KINDS:
        entry = accelerator_entry()
        if entry is not None:
            entry.set_rng_state(_broadcast_state(entry.get_rng_state(), device))
    elif kind is RNGType.GENERATOR:
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator to sync.")
        generator.set_state(_broadcast_state(generator.get_state(), device))
    elif kind is RNGType.PYTHON:
        box = [random.getstate()]
        dist.broadcast_object_list(box, src=0)
        random.setstate(box[0])
    elif kind is RNGType.NUMPY:
        np = _numpy()
        if np is not None:
            box = [np.random.get_state()]
            dist.broadcast_object_list(box, src=0)
            np.random.set_state(box[0])


def synchronize_rng_states(
    rng_types: Iterable[str | RNGType], generator: torch.Generator | None = None
) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
