"""Familiar path `accelerate.accelerator`: re-exports from the packages that own the code."""

from accel._accelerator import Accelerator

__all__ = ["Accelerator"]
