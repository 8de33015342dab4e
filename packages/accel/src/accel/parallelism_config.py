"""Familiar path `accelerate.parallelism_config`: re-exports from the packages that own the code."""

from accel._compat._left_out import ParallelismConfig

__all__ = ["ParallelismConfig"]
