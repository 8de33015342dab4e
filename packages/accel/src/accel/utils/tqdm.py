"""Familiar path `accelerate.utils.tqdm`: re-exports from the packages that own the code."""

from accel._compat._extras import tqdm

__all__ = ["tqdm"]
