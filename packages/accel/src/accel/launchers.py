"""Familiar path `accelerate.launchers`: re-exports from the packages that own the code."""

from accel._compat._misc import test_launch
from accel._launchers import debug_launcher, notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher", "test_launch"]
