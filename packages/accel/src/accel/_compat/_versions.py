"""Version comparisons on installed libraries and on torch."""

from __future__ import annotations

import importlib.metadata
import operator
from collections.abc import Callable
from typing import Any

STR_OPERATION_TO_FUNC: dict[str, Callable[[object, object], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


def _version(text: str) -> Any:
    try:
        from packaging.version import Version
    except ImportError:  # torch ships its own copy
        from torch._vendor.packaging.version import Version
    return Version(text)


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (given by name) or a version with
    `requirement_version` using `operation` (one of >, >=, ==, !=, <=, <)."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"operation {operation!r} is not one of {list(STR_OPERATION_TO_FUNC)}.")
    version = library_or_version
    if isinstance(version, str):
        try:
            version = _version(importlib.metadata.version(version))
        except importlib.metadata.PackageNotFoundError:
            version = _version(version)
    return STR_OPERATION_TO_FUNC[operation](version, _version(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch's version (without a local suffix) with `version`."""
    import torch

    return compare_versions(_version(_version(torch.__version__).base_version), operation, version)
