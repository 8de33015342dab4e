"""Familiar path `accelerate.launchers`."""

from accel._launchers import debug_launcher, notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher"]
