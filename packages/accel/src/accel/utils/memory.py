"""Familiar path `accelerate.utils.memory`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_cuda_available,
    is_mps_available,
)
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

# accelerate's module binds these too; users import them from here
__all__ += [
    "is_cuda_available",
    "is_mps_available",
]
