"""Familiar path `accelerate.utils.tqdm`: re-exports from the packages that own the code."""

from accel._compat._imports import is_tqdm_available
from accel._compat._utils_tqdm import tqdm
from accel_state import (
    PartialState,
)

__all__ = ["tqdm"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "PartialState",
    "is_tqdm_available",
]
