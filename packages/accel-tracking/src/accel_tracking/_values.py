"""Turning what a training loop logs into what a back-end accepts.

Training code logs nested dicts, 0-d tensors, numpy scalars, strings and sometimes `None`.
Each back-end takes a narrower set. The helpers here convert what can be converted (nested
dicts become "/" keys, tensors and numpy scalars become Python numbers) and drop the rest
with one `TrackerValueWarning` per key, so a bad value never stops a training run. They
always build new dicts: the caller's dicts are never changed.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping
from typing import Any

Scalar = bool | int | float | str


class TrackerValueWarning(UserWarning):
    """A logged value was converted or dropped because the back-end cannot take it."""


def flatten_dict(values: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """Return a new flat dict: ``{"a": {"b": 1}}`` becomes ``{"a/b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten_dict(value, sep, name))
        else:
            out[name] = value
    return out


def _numel(value: Any) -> int | None:
    numel = getattr(value, "numel", None)  # torch tensors
    if callable(numel):
        return int(numel())
    size = getattr(value, "size", None)  # numpy arrays and scalars
    return size if isinstance(size, int) else None


def to_python(value: Any) -> Any:
    """Tensors and numpy values to Python numbers (one element) or lists; others unchanged.

    Duck-typed on ``.item()`` / ``.tolist()`` so that neither torch nor numpy is imported.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    tolist = getattr(value, "tolist", None)
    if not callable(tolist):
        if isinstance(value, numbers.Real):  # Fraction, Decimal-like numbers
            return float(value)
        return value
    if hasattr(value, "detach"):  # a torch tensor that may need grad
        value = value.detach()
    item = getattr(value, "item", None)
    if _numel(value) == 1 and callable(item):
        return item()
    return value.tolist()


def to_python_tree(value: Any) -> Any:
    """`to_python` applied through nested dicts, lists and tuples (for configurations)."""
    if isinstance(value, Mapping):
        return {str(k): to_python_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python_tree(v) for v in value]
    return to_python(value)


def coerce_step(step: Any) -> int | None:
    """Return `step` as an int (or None); a tensor or numpy integer is accepted."""
    step = to_python(step)
    if step is None or (isinstance(step, int) and not isinstance(step, bool)):
        return step
    if isinstance(step, float) and step.is_integer():
        return int(step)
    raise TypeError(
        f"step={step!r} ({type(step).__name__}) is not an integer. Pass the global step as an "
        f"int, or step=None to let the tracker count."
    )


def warn_once(warned: set[str], tracker: str, key: str, what: str) -> None:
    """Warn that `key` was dropped or converted, once per tracker instance and key."""
    if key in warned:
        return
    warned.add(key)
    warnings.warn(f"{tracker} tracker: {key!r} {what}.", TrackerValueWarning, stacklevel=4)


def _describe(value: Any) -> str:
    if value is None:
        return "is None"
    if isinstance(value, str):
        return "is a string"
    if isinstance(value, list):
        return f"is not a scalar ({len(value)} values)"
    return f"has type {type(value).__name__}"


def scalar_values(
    values: Mapping[str, Any],
    *,
    tracker: str,
    warned: set[str],
    strings: bool = False,
) -> dict[str, Scalar]:
    """Flatten `values` and keep what is a number (and a string when `strings` is True).

    Booleans become 0/1. Everything else is dropped with one warning per key.
    """
    out: dict[str, Scalar] = {}
    for key, raw in flatten_dict(values).items():
        value = to_python(raw)
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float)) or (strings and isinstance(value, str)):
            out[key] = value
        else:
            accepted = "numbers and strings" if strings else "numbers"
            warn_once(warned, tracker, key, f"{_describe(value)}; it takes {accepted}, skipped")
    return out


def param_values(
    values: Mapping[str, Any], *, tracker: str, warned: set[str]
) -> dict[str, bool | int | float | str]:
    """Flatten a configuration into scalars for back-ends whose hyperparameters are flat.

    Lists and other objects become their string form; `None` values are dropped with a warning.
    """
    out: dict[str, bool | int | float | str] = {}
    for key, raw in flatten_dict(values).items():
        value = to_python(raw)
        if value is None:
            warn_once(warned, tracker, key, "is None; hyperparameters must have a value, skipped")
        elif isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = str(value)
    return out


def json_safe(value: Any) -> Any:
    """Convert a tree to JSON types; objects JSON cannot hold become their string form."""
    value = to_python_tree(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value  # NaN and infinities are written as NaN / Infinity, which Python reads
    return str(value)
