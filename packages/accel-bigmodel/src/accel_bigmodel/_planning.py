"""Steps of device-map planning that code written for accelerate calls on their own.

They work on the planner's worklist: a list of ``(full name, module or tensor)`` entries still
to place, and the sizes from `compute_module_sizes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from accel_bigmodel._sizes import convert_file_size_to_int

Entry = tuple[str, nn.Module | torch.Tensor]


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """The names in `module_sizes` that no other name extends (tensors and empty modules)."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def _owner_index(param: str, entries: list[Entry]) -> int:
    for i, (name, _) in enumerate(entries):
        if param.startswith(f"{name}."):
            return i
    raise ValueError(
        f"Tied parameter {param!r} is under none of the entries still to place "
        f"{[n for n, _ in entries][:20]}; pass the entries that hold it."
    )


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: Mapping[str, int],
    modules_to_treat: list[Entry],
) -> tuple[int, list[str], list[nn.Module | torch.Tensor]]:
    """The size of a module together with the entries holding the parameters tied to it.

    Each name in `tied_params` lives under one entry of `modules_to_treat`; that entry comes
    along (its size counted without the shared tensor). Returns the total size and the
    names and objects of those entries, one per tied parameter.
    """
    names: list[str] = []
    objects: list[nn.Module | torch.Tensor] = []
    total = module_size
    for param in tied_params:
        name, obj = modules_to_treat[_owner_index(param, modules_to_treat)]
        names.append(name)
        objects.append(obj)
        total += module_sizes.get(name, 0) - module_sizes.get(param, 0)  # ties sized once
    return total, names, objects


def _tied_outside(name: str, tied_parameters: list[list[str]]) -> list[str]:
    """The parameters tied to one inside entry `name` that lie outside it."""
    inside = lambda p: p == name or p.startswith(f"{name}.")  # noqa: E731
    outside: list[str] = []
    for group in tied_parameters:
        if any(map(inside, group)) and not all(map(inside, group)):
            outside += [p for p in group if not inside(p)]
    return outside


def _holds(entries: list[Entry], param: str) -> bool:
    return any(param.startswith(f"{name}.") for name, _ in entries)


def _split(name: str, obj: nn.Module | torch.Tensor) -> list[Entry]:
    """An entry's own parameters, children and own buffers, by full name (none for a tensor).

    The buffers come last, as for the model itself. (accelerate leaves a split module's own
    buffers out of the map, which then fails its own check; here they are placed.)
    """
    if not isinstance(obj, nn.Module):
        return []
    parts = list(obj.named_parameters(recurse=False)) + list(obj.named_children())
    parts += list(obj.named_buffers(recurse=False))
    return [(f"{name}.{n}", v) for n, v in parts]


def fallback_allocate(
    modules: list[Entry],
    module_sizes: Mapping[str, int],
    size_limit: int | float | str,
    no_split_module_classes: Iterable[str] | None = None,
    tied_parameters: list[list[str]] | None = None,
) -> tuple[str | None, nn.Module | torch.Tensor | None, list[Entry]]:
    """Find, breadth first, an entry (or a piece of one) that fits in `size_limit`.

    Used when the next module does not fit on a device: something later may, so the device
    is not left empty. Returns its name, the object, and `modules` without it (a split parent
    replaced by its pieces); ``(None, None, modules)`` when nothing fits.
    """
    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = set(no_split_module_classes or ())
    tied = tied_parameters or []
    todo = list(modules)
    found = None
    while todo:
        name, obj = todo.pop(0)
        ties = [p for p in _tied_outside(name, tied) if _holds(todo, p)]
        size, _, _ = get_module_size_with_ties(ties, module_sizes.get(name, 0), module_sizes, todo)
        if size <= limit:
            found = name
            break
        splittable = isinstance(obj, nn.Module) and type(obj).__name__ not in no_split
        if splittable and any(True for _ in obj.children()):
            todo = _split(name, obj) + todo
    if found is None:
        return None, None, modules
    remaining = list(modules)
    for dot in (i for i, c in enumerate(found) if c == "."):
        names = [n for n, _ in remaining]
        parent = found[:dot]
        if parent in names:
            i = names.index(parent)
            remaining[i : i + 1] = _split(parent, remaining[i][1])
    i = [n for n, _ in remaining].index(found)
    entry = remaining.pop(i)
    return entry[0], entry[1], remaining
