"""Familiar path `accelerate.state`: re-exports from the packages that own the code."""

from accel._accelerator import AcceleratorState, GradientState
from accel._compat._misc import ThreadLocalSharedDict, do_nothing, is_initialized
from accel_state import DistributedType, PartialState

__all__ = [
    "AcceleratorState",
    "DistributedType",
    "GradientState",
    "PartialState",
    "ThreadLocalSharedDict",
    "do_nothing",
    "is_initialized",
]
