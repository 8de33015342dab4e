"""Familiar path `accelerate.optimizer`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratedOptimizer,
    AcceleratorState,
    GradientState,
)
from accel._compat._imports import (
    is_lomo_available,
)
from accel._compat._optimizer import (
    move_to_device,
    patch_optimizer_step,
)
from accel_state import (
    DistributedType,
    honor_type,
)

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratorState",
    "DistributedType",
    "GradientState",
    "honor_type",
    "is_lomo_available",
]
