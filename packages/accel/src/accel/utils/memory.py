"""Familiar path `accelerate.utils.memory`: re-exports from the packages that own the code."""

from accel._memory import find_executable_batch_size, release_memory

__all__ = ["find_executable_batch_size", "release_memory"]
