"""Familiar path `accelerate.local_sgd`: re-exports from the packages that own the code."""

from accel._accelerator import (
    Accelerator,
)
from accel._compat._local_sgd import LocalSGD
from accel_state import (
    DistributedType,
)

__all__ = ["LocalSGD"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "Accelerator",
    "DistributedType",
]
