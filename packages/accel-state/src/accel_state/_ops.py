"""Collectives over nested data (lists, tuples, namedtuples, dicts, dataclasses of tensors).

Non-tensor leaves pass through untouched. Every collective returns its input unchanged when
there is no process group or only one process.

Debug mode (`ACCEL_DEBUG_MODE=1`, set by `accel launch --debug`): before gather, reduce,
broadcast and pad_across_processes, every process shares the shapes it holds (one
all_gather_object), and when they cannot meet, every process raises
`DistributedOperationException` naming each process's shapes, instead of hanging.

With the hang doctor on (accel_state.hang), each collective is numbered and recorded in the
process's ring (after the debug-mode check, which keeps its message).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from accel_state._enums import DistributedType
from accel_state._environment import ENV_DEBUG_MODE
from accel_state._record import recorded
from accel_state._state import PartialState, debug_mode


def is_torch_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def honor_type(like: Any, items: Any) -> Any:
    """Build a sequence of the same type as `like` (namedtuples included) from `items`."""
    if is_namedtuple(like):
        return type(like)(*list(items))
    return type(like)(items)


def _rebuild_mapping(like: Mapping, items: dict) -> Any:
    try:
        return type(like)(items)
    except TypeError:
        return items


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply `func` to every leaf of `data` that passes `test_type`, keeping the structure."""

    def apply(obj: Any) -> Any:
        if test_type(obj):
            return func(obj, *args, **kwargs)
        if isinstance(obj, (list, tuple)):
            return honor_type(obj, (apply(o) for o in obj))
        if isinstance(obj, Mapping):
            return _rebuild_mapping(obj, {k: apply(v) for k, v in obj.items()})
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {
                f.name: apply(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init
            }
            return type(obj)(**fields)
        if error_on_other_type:
            raise TypeError(
                f"Unsupported types ({type(obj)}) passed to `{getattr(func, '__name__', func)}`. "
                f"Only nested list/tuple/dicts of objects that are valid for "
                f"`{getattr(test_type, '__name__', test_type)}` should be passed."
            )
        return obj

    return apply(data)


def _leaves(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    recursively_apply(found.append, data)
    return found


def send_to_device(
    tensor: Any,
    device: torch.device | str | int,
    non_blocking: bool = False,
    skip_keys: str | Sequence[str] | None = None,
) -> Any:
    """Move every tensor of a nested structure to `device` (dict keys in `skip_keys` stay)."""
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    skip = set(skip_keys or ())

    def move(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(device, non_blocking=non_blocking)
        if isinstance(obj, (list, tuple)):
            return honor_type(obj, (move(o) for o in obj))
        if isinstance(obj, Mapping):
            return _rebuild_mapping(obj, {k: (v if k in skip else move(v)) for k, v in obj.items()})
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return type(obj)(
                **{f.name: move(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
            )
        to = getattr(obj, "to", None)
        if callable(to):  # objects such as tokenizer outputs know how to move themselves
            try:
                return to(device, non_blocking=non_blocking)
            except TypeError:
                return to(device)
        return obj

    return move(tensor)


class CannotPadNestedTensorWarning(UserWarning):
    """pad_across_processes was given a nested tensor, which it returns unpadded."""


class DistributedOperationException(RuntimeError):
    """A collective whose inputs cannot meet across processes (raised in debug mode)."""


Shapes = list[tuple[int, ...]]


def shape_mismatch(operation: str, shapes: Sequence[Shapes], dim: int = 0) -> str | None:
    """Why the shapes each process holds cannot meet in `operation`, or None when they can.

    gather: same number of tensors, same dimensions after the first; pad_across_processes:
    the same except along `dim`; reduce and broadcast: identical shapes.
    """
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes):
        return "the processes hold different numbers of tensors"
    for i, leaf in enumerate(first):
        others = [s[i] for s in shapes]
        if any(len(o) != len(leaf) for o in others):
            return f"tensor {i} has a different number of dimensions on some processes"
        if operation == "gather":
            if any(o[1:] != leaf[1:] for o in others):
                return f"tensor {i} differs after its first dimension (only that one may vary)"
        elif operation == "pad_across_processes":
            axis = dim % len(leaf) if leaf else 0
            strip = [o[:axis] + o[axis + 1 :] for o in others]
            if any(o != strip[0] for o in strip):
                return f"tensor {i} differs in a dimension other than dim={dim}"
        elif any(o != leaf for o in others):
            return f"tensor {i} has different shapes (they must be identical)"
    return None


def _verify(operation: str, data: Any, dim: int = 0) -> None:
    """In debug mode, raise on every process when the shapes cannot meet in `operation`."""
    if not debug_mode():
        return
    import torch.distributed as dist

    mine = [tuple(t.shape) for t in _leaves(data)]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    why = shape_mismatch(operation, everyone, dim)
    if why is not None:
        listing = "\n".join(f"  - process {r}: {s}" for r, s in enumerate(everyone))
        raise DistributedOperationException(
            f"{operation}: the tensors' shapes cannot meet across processes ({why}); stopped "
            f"instead of hanging ({ENV_DEBUG_MODE} is on). Shapes:\n{listing}"
        )


def _world(group: Any = None) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _gather_one(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if tensor.ndim == 0:
        tensor = tensor[None]
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    sizes = torch.tensor(tensor.shape, device=tensor.device, dtype=torch.long)
    all_sizes = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(all_sizes, sizes, group=group)
    shapes = [tuple(s.tolist()) for s in all_sizes]
    if any(s[1:] != shapes[0][1:] for s in shapes):
        raise ValueError(
            f"gather: ranks hold tensors whose dimensions after the first differ: {shapes}. Only "
            f"the first dimension may vary; pad the others with pad_across_processes(dim=...)."
        )
    longest = max(s[0] for s in shapes)
    if tensor.shape[0] < longest:
        pad = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
        tensor = torch.cat([tensor, pad])
    out = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(out, tensor, group=group)
    return torch.cat([o[: s[0]] for o, s in zip(out, shapes)])


def gather(tensor: Any, *, group: Any = None) -> Any:
    """Concatenate each tensor across processes (of `group`, default all) along the first
    dimension.

    Tensors whose first dimension differs between ranks are padded for the exchange and
    trimmed back, so the result holds exactly every rank's rows in rank order.
    """
    if _world(group) == 1:
        return tensor
    _verify("gather", tensor)
    return recorded(
        "gather",
        tensor,
        lambda: recursively_apply(
            lambda t: _gather_one(t, group), tensor, error_on_other_type=False
        ),
    )


def _refuse_on_xla() -> None:

    topology = PartialState._topology
    if topology is not None and topology.distributed_type == DistributedType.XLA:
        raise NotImplementedError(
            "gather objects in TPU is not supported: on XLA, gather tensors (gather, "
            "gather_for_metrics without use_gather_object) instead of Python objects."
        )


def gather_object(obj: Any, *, group: Any = None) -> list[Any]:
    """Gather picklable objects: lists and tuples are concatenated, anything else is listed.
    Refused on XLA, as accelerate refuses it (XLA's collectives move tensors only)."""
    import torch.distributed as dist

    _refuse_on_xla()
    if _world(group) == 1:
        return list(obj) if isinstance(obj, (list, tuple)) else [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    recorded("gather_object", obj, lambda: dist.all_gather_object(out, obj, group=group))
    if isinstance(obj, (list, tuple)):
        return [item for part in out for item in part]
    return out


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Send each tensor of `from_process` to every process (in place; returned too)."""
    import torch.distributed as dist

    if _world() == 1:
        return tensor
    _verify("broadcast", tensor)

    def one(t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=from_process)
        return t

    return recorded("broadcast", tensor, lambda: recursively_apply(one, tensor))


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of `object_list` by those of `from_process`, in place."""
    import torch.distributed as dist

    if _world() == 1:
        return object_list
    recorded(
        "broadcast_object_list",
        object_list,
        lambda: dist.broadcast_object_list(object_list, src=from_process),
    )
    return object_list


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0, *, group: Any = None) -> Any:
    """Sum, average or take the maximum of each tensor across processes (of `group`, default
    all); returns new tensors, inputs are untouched."""
    import torch.distributed as dist

    if reduction not in ("sum", "mean", "max", "none"):
        raise ValueError(f"reduction={reduction!r}: expected 'sum', 'mean', 'max' or 'none'.")
    world = _world(group)
    if world > 1 and reduction != "none":
        _verify("reduce", tensor)

    def one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if world > 1 and reduction != "none":
            op = dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM
            dist.all_reduce(out, op=op, group=group)
            if reduction == "mean":
                out = out / world if not out.is_floating_point() else out.div_(world)
        return out * scale if scale != 1.0 else out

    if world == 1 or reduction == "none":
        return recursively_apply(one, tensor)
    return recorded("reduce", tensor, lambda: recursively_apply(one, tensor))


def pad_across_processes(
    tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad each tensor along `dim` to the largest size any process holds."""
    import torch.distributed as dist

    if isinstance(tensor, torch.Tensor) and tensor.is_nested:
        warnings.warn(
            "pad_across_processes cannot pad a nested tensor; it is returned unchanged.",
            CannotPadNestedTensorWarning,
            stacklevel=2,
        )
        return tensor
    if _world() == 1:
        return tensor
    _verify("pad_across_processes", tensor, dim)

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim == 0 or dim >= t.ndim or dim < -t.ndim:
            return t
        axis = dim % t.ndim
        size = torch.tensor([t.shape[axis]], device=t.device)
        sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
        dist.all_gather(sizes, size)
        longest = max(int(s.item()) for s in sizes)
        if longest == t.shape[axis]:
            return t
        shape = list(t.shape)
        shape[axis] = longest
        out = t.new_full(shape, pad_index)
        start = longest - t.shape[axis] if pad_first else 0
        index = [slice(None)] * t.ndim
        index[axis] = slice(start, start + t.shape[axis])
        out[tuple(index)] = t
        return out

    return recorded("pad_across_processes", tensor, lambda: recursively_apply(one, tensor))


def concatenate(data: Sequence[Any], dim: int = 0) -> Any:
    """Concatenate a list of structures with the same shape, leaf by leaf."""
    if not data:
        raise ValueError("concatenate needs at least one structure.")
    if len(data) == 1:  # one batch: nothing to join, whatever it holds
        return data[0]
    first = data[0]
    if isinstance(first, (list, tuple)):
        return honor_type(
            first, (concatenate([d[i] for d in data], dim) for i in range(len(first)))
        )
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {k: concatenate([d[k] for d in data], dim) for k in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    raise TypeError(
        f"concatenate takes nested lists, tuples and dicts of tensors; got {type(first).__name__}."
    )


def find_batch_size(data: Any) -> int | None:
    """The first dimension of the first tensor found in `data` (None if there is none)."""
    leaves = _leaves(data)
    for leaf in leaves:
        if leaf.ndim > 0:
            return int(leaf.shape[0])
    return None
