"""Familiar path `accelerate.scheduler`: re-exports from the packages that own the code."""

from accel._accelerator import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
