"""Familiar path `accelerate.utils.versions`: re-exports from the packages that own the code."""

from accel._compat._versions import (
    STR_OPERATION_TO_FUNC,
    compare_versions,
    is_torch_version,
)

__all__ = ["compare_versions", "is_torch_version"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "STR_OPERATION_TO_FUNC",
]
