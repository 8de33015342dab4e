"""Familiar path `accelerate.optimizer`: re-exports from the packages that own the code."""

from accel._accelerator import AcceleratedOptimizer
from accel._compat._misc import move_to_device, patch_optimizer_step

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step"]
