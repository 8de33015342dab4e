"""Walking nested batches: move them to a device, find their size, flatten them for a broadcast.

A batch is any nesting of tensors in dicts (any Mapping), lists, tuples and namedtuples;
other leaves (strings, numbers, None) are carried along untouched. An object with a `.to`
method (e.g. a tokenizer's BatchEncoding) is moved with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def _is_namedtuple(data: Any) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_fields")


def _rebuild_mapping(data: Mapping, items: dict) -> Any:
    try:
        return type(data)(items)
    except TypeError:  # a Mapping type whose constructor wants something else
        return items


def map_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply `fn` to every tensor in a nested batch, keeping the containers' types."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if _is_namedtuple(data):
        return type(data)(*(map_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(v, fn) for v in data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: map_tensors(v, fn) for k, v in data.items()})
    return data


def send_to_device(data: Any, device: torch.device | str | None, non_blocking: bool = False) -> Any:
    """Move every tensor of a nested batch to `device` (a no-op for `device=None`)."""
    if device is None:
        return data
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, (list, tuple, Mapping)):

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        kind = type(data)
        if kind is list or kind is tuple:  # a collated batch, moved once a step: walk it inline
            return kind(
                [
                    v.to(device, non_blocking=non_blocking)
                    if isinstance(v, torch.Tensor)
                    else map_tensors(v, move)
                    for v in data
                ]
            )
        return map_tensors(data, move)
    to = getattr(data, "to", None)
    if callable(to):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:  # a `.to` without the non_blocking keyword
            return to(device)
    return data


def find_batch_size(data: Any) -> int | None:
    """Size of the first dimension of the first tensor found in the batch (None if none)."""
    found: list[int] = []

    def visit(t: torch.Tensor) -> torch.Tensor:
        if not found and t.dim() > 0:
            found.append(t.shape[0])
        return t

    map_tensors(data, visit)
    return found[0] if found else None


class _Slot:
    """Placeholder for the i-th tensor in a flattened batch (pickles small)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple:
        return (_Slot, (self.index,))


def flatten(data: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split a batch into a tensor-free skeleton and its tensors, in a fixed order."""
    tensors: list[torch.Tensor] = []

    def take(t: torch.Tensor) -> _Slot:
        tensors.append(t)
        return _Slot(len(tensors) - 1)

    return map_tensors(data, take), tensors


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of `flatten`: put the tensors back into the skeleton."""
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index]
    if _is_namedtuple(skeleton):
        return type(skeleton)(*(unflatten(v, tensors) for v in skeleton))
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(unflatten(v, tensors) for v in skeleton)
    if isinstance(skeleton, Mapping):
        return _rebuild_mapping(skeleton, {k: unflatten(v, tensors) for k, v in skeleton.items()})
    return skeleton


def slice_tensors(data: Any, index: slice | torch.Tensor) -> Any:
    """Index the first dimension of every (non-scalar) tensor of the batch."""
    return map_tensors(data, lambda t: t[index] if t.dim() > 0 else t)
