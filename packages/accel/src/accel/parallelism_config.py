"""Familiar path `accelerate.parallelism_config`: re-exports from the packages that own the code."""

from accel_parallel import ParallelismConfig

__all__ = ["ParallelismConfig"]
