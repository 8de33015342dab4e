"""Familiar path `accelerate.logging`: re-exports from the packages that own the code."""

from accel._logging import MultiProcessAdapter, get_logger
from accel_state import (
    PartialState,
)

__all__ = ["MultiProcessAdapter", "get_logger"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "PartialState",
]
