"""Familiar path `accelerate.checkpointing`: re-exports from the packages that own the code."""

from accel._compat._misc import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)

__all__ = [
    "load_accelerator_state",
    "load_custom_state",
    "save_accelerator_state",
    "save_custom_state",
]
