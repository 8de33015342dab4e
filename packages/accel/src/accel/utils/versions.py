"""Familiar path `accelerate.utils.versions`: re-exports from the packages that own the code."""

from accel._compat._versions import compare_versions, is_torch_version

__all__ = ["compare_versions", "is_torch_version"]
