"""Familiar path `accelerate.utils.torch_xla`: re-exports from the packages that own the code."""

from accel._compat._left_out import install_xla

__all__ = ["install_xla"]
