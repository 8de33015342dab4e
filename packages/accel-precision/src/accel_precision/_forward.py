"""A removable wrapper around `model.forward`: a context (autocast), input casting, fp32 outputs.

The wrapper is installed as an instance attribute, so `unwrap_forward` can put back exactly
what was there before (usually nothing: the class's own `forward`), which is what
`unwrap_model(model, keep_fp32_wrapper=False)` needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)

_BACKUP = "_accel_forward_backup"
_NOTHING = object()  # the instance had no `forward` attribute of its own
_HALF = (torch.float16, torch.bfloat16)


def apply_to_tensors(data: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply `fn` to every tensor inside nested lists, tuples, namedtuples, dicts and dataclasses."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(apply_to_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(v, fn) for v in data)
    if isinstance(data, Mapping):
        items = {k: apply_to_tensors(v, fn) for k, v in data.items()}
        try:
            return type(data)(**items) if hasattr(data, "to_tuple") else type(data)(items)
        except TypeError:
            return items
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {
            f.name: apply_to_tensors(getattr(data, f.name), fn) for f in dataclasses.fields(data)
        }
        return dataclasses.replace(data, **changes)
    return data


def _to_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in _HALF else t


def convert_outputs_to_fp32(data: Any) -> Any:
    """Return `data` with every fp16/bf16 tensor in it converted to fp32 (differentiably)."""
    return apply_to_tensors(data, _to_fp32)


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """Return `data` with every floating-point tensor in it cast to `dtype` (integers untouched)."""
    return apply_to_tensors(data, lambda t: t.to(dtype) if t.is_floating_point() else t)


def wrap_forward(
    model: M,
    *,
    context: Callable[[], AbstractContextManager[Any]] | None = None,
    input_dtype: torch.dtype | None = None,
    fp32_outputs: bool = True,
) -> M:
    """Wrap `model.forward`: run it inside `context()`, cast float inputs, return fp32 outputs.

    Wrapping twice replaces the first wrapper (they never stack). The returned model is the
    same object; `unwrap_forward` removes the wrapper.
    """
    unwrap_forward(model)
    original = model.forward
    backup = model.__dict__.get("forward", _NOTHING)
    make_context = context if context is not None else contextlib.nullcontext

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if input_dtype is not None:
            args, kwargs = cast_floating((args, kwargs), input_dtype)
        with make_context():
            out = original(*args, **kwargs)
        return convert_outputs_to_fp32(out) if fp32_outputs else out

    model.__dict__[_BACKUP] = backup
    model.forward = forward
    return model


def unwrap_forward(model: M) -> M:
    """Remove the wrapper `wrap_forward` installed, if any, and return the same model."""
    backup = model.__dict__.pop(_BACKUP, None)
    if backup is None:
        return model
    if backup is _NOTHING:
        model.__dict__.pop("forward", None)
    else:
        model.__dict__["forward"] = backup
    return model


def has_wrapped_forward(model: torch.nn.Module) -> bool:
    """Whether `wrap_forward` installed a wrapper on this model."""
    return _BACKUP in model.__dict__
