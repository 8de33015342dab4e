"""Familiar path `accelerate.utils.memory`: re-exports from the packages that own the code."""

from accel._memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

__all__ = [
    "clear_device_cache",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
]
