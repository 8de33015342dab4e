"""Familiar path `accelerate.scheduler`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratedScheduler,
    AcceleratorState,
    GradientState,
)

__all__ = ["AcceleratedScheduler"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratorState",
    "GradientState",
]
