"""Familiar path `accelerate.local_sgd`: re-exports from the packages that own the code."""

from accel._compat._misc import LocalSGD

__all__ = ["LocalSGD"]
