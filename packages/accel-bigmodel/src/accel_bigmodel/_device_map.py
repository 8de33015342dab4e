"""Device maps: which device holds each block of a model, planned from a memory budget.

A device map is ``{module_name: device}`` where every parameter and buffer of the model falls
under exactly one key ("" covers the whole model). Devices are GPU indices, "cpu" or "disk".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from accel_bigmodel._modeling import find_tied_parameters
from accel_bigmodel._sizes import (
    Device,
    compute_module_sizes,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    normalize_device,
    parse_max_memory,
)

DEVICE_MAP_STRINGS = ("auto", "balanced", "balanced_low_0", "sequential")


def _is_offload(device: Device) -> bool:
    return device in ("cpu", "disk")


def _entries(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module | torch.Tensor]]:
    """The children of `module` and its own tensors, as (full name, object) in order."""
    join = (lambda n: f"{prefix}.{n}") if prefix else (lambda n: n)
    own = [(join(n), t) for n, t in module.named_parameters(recurse=False)]
    own += [(join(n), t) for n, t in module.named_buffers(recurse=False)]
    return own + [(join(n), m) for n, m in module.named_children()]


def _plan(
    model: nn.Module,
    budget: dict[Device, int],
    sizes: dict[str, int],
    no_split: set[str],
    reserve: int,
    fallback_allocation: bool,
    verbose: bool,
) -> dict[str, Device]:
    devices = list(budget)
    main = devices[0]
    device_map: dict[str, Device] = {}
    todo = _entries(model, "")
    tied = find_tied_parameters(model)
    index, used = 0, 0
    while todo:
        name, obj = todo.pop(0)
        size = sizes.get(name, 0) if isinstance(obj, nn.Module) else _obj_size(obj, name, sizes)
        device = devices[index]
        room = budget[device] - used - (reserve if device == main else 0)
        # Entries still to place that hold a weight tied to one in this entry go with it, so
        # the tie stays one tensor on one device (as accelerate plans it).
        partners = _tied_partners(name, tied, todo)
        together = size + sum(_entry_size(todo[i], sizes) for i in partners)
        if device == "disk" or together <= room:
            device_map[name] = device
            for i in partners:
                device_map[todo[i][0]] = device
            todo = [entry for i, entry in enumerate(todo) if i not in partners]
            used += together
            if verbose:
                print(f"Putting {name} ({size} bytes) on {device}.")
            continue
        if isinstance(obj, nn.Module) and type(obj).__name__ not in no_split:
            children = _entries(obj, name)
            if children:
                if verbose:
                    print(f"Splitting {name} ({size} bytes): it does not fit on {device}.")
                todo = children + todo
                continue
        if fallback_allocation:
            found = _fallback(todo, sizes, room)
            if found is not None:
                fname, _ = todo.pop(found)
                device_map[fname] = device
                used += sizes.get(fname, 0)
                todo.insert(0, (name, obj))
                continue
        # "disk" is always in the budget and takes anything, so a next device exists here.
        if verbose:
            print(
                f"{name} ({size} bytes) does not fit on {device}; moving to {devices[index + 1]}."
            )
        todo.insert(0, (name, obj))
        index, used = index + 1, 0
    return device_map


def _covers(entry: str, name: str) -> bool:
    return entry == "" or name == entry or name.startswith(f"{entry}.")


def _tied_partners(name: str, tied: list[list[str]], todo: list) -> list[int]:
    """Indices of the `todo` entries holding a parameter tied to one inside entry `name`."""
    found: set[int] = set()
    for group in tied:
        if not any(_covers(name, p) for p in group):
            continue
        for other in (p for p in group if not _covers(name, p)):
            for i, (entry, _) in enumerate(todo):
                if _covers(entry, other):
                    found.add(i)
                    break
    return sorted(found)


def _entry_size(entry: tuple[str, nn.Module | torch.Tensor], sizes: dict[str, int]) -> int:
    name, obj = entry
    return sizes.get(name, 0) if isinstance(obj, nn.Module) else _obj_size(obj, name, sizes)


def _obj_size(tensor: torch.Tensor, name: str, sizes: dict[str, int]) -> int:
    return sizes.get(name, tensor.numel() * tensor.element_size())


def _fallback(todo: list, sizes: dict[str, int], room: int) -> int | None:
    for i, (name, _) in enumerate(todo):
        if 0 < sizes.get(name, 0) <= room:
            return i
    return None


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, Device]:
    """Plan a device map filling devices in order (GPUs, then "cpu", then "disk").

    Modules are placed whole when they fit, split into their children when not, and never
    split when their class name is in `no_split_module_classes`. When some blocks end up on
    "cpu"/"disk" while a GPU runs the model, the GPU keeps room for the largest block (it is
    loaded there to run) and, unless `offload_buffers`, for the buffers that stay on it.
    """
    budget = get_max_memory(None) if max_memory is None else parse_max_memory(max_memory)
    if not budget:
        raise ValueError("max_memory is empty; give at least one device, e.g. {'cpu': '4GB'}.")
    if "disk" not in budget:  # what fits nowhere else spills to disk (dispatching it then
        budget["disk"] = 2**62  # needs an offload folder, and says so)
    no_split = set(no_split_module_classes or ())
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    args = (model, budget, sizes, no_split)
    device_map = _plan(*args, 0, fallback_allocation, verbose)
    main = next(iter(budget))
    offloaded = [n for n, d in device_map.items() if _is_offload(d)]
    if not _is_offload(main) and offloaded:
        layer, _ = get_max_layer_size(list(model.named_children()), sizes, no_split)
        buffers = 0
        if not offload_buffers:
            buffer_sizes = compute_module_sizes(model, buffers_only=True)
            buffers = sum(buffer_sizes.get(n, 0) for n in offloaded)
        device_map = _plan(*args, layer + buffers, fallback_allocation, verbose)
    return clean_device_map(device_map) if clean_result else device_map


def clean_device_map(device_map: Mapping[str, Device], prefix: str = "") -> dict[str, Device]:
    """Merge entries: a module whose entries all share one device becomes one entry."""
    result = dict(device_map)
    names = [n for n in result if n == prefix or n.startswith(f"{prefix}.") or not prefix]
    values = {result[n] for n in names}
    if len(values) == 1 and names != [prefix]:
        for name in names:
            del result[name]
        result[prefix] = values.pop()
        return result
    if prefix in result:
        return result
    depth = len(prefix.split(".")) if prefix else 0
    children = sorted({".".join(n.split(".")[: depth + 1]) for n in names if n != prefix})
    for child in children:
        result = clean_device_map(result, child)
    return result


def check_device_map(model: nn.Module, device_map: Mapping[str, Device]) -> None:
    """Raise a ValueError when `device_map` misses, repeats or invents part of `model`."""
    if not isinstance(device_map, Mapping):
        raise ValueError(
            f"device_map must be a dict or one of {DEVICE_MAP_STRINGS}, not {device_map!r}."
        )
    for device in device_map.values():
        normalize_device(device)
    keys = sorted(device_map)
    repeated = [(a, b) for a in keys for b in keys if a != b and (a == "" or b.startswith(f"{a}."))]
    if repeated:
        pairs = ", ".join(f"{a!r} contains {b!r}" for a, b in repeated[:10])
        raise ValueError(
            f"The device_map places some modules twice ({pairs}). Give each module one entry: "
            f"keep the parent or its children, not both."
        )
    modules = {n for n, _ in model.named_modules()}
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    unknown = [k for k in keys if k not in modules and k not in names]
    if unknown:
        raise ValueError(
            f"The device_map names {unknown} which are not modules or tensors of the model "
            f"({type(model).__name__}). Check the spelling against model.named_modules()."
        )
    missing = [n for n in names if _lookup(device_map, n) is None]
    if missing:
        owners = sorted({n.rsplit(".", 1)[0] if "." in n else n for n in missing})
        raise ValueError(
            f"The device_map does not place {len(missing)} tensor(s) of the model: modules "
            f"{owners[:20]}{' ...' if len(owners) > 20 else ''}. Add them to the map (or map "
            f"'' to a device to place everything)."
        )


def _lookup(device_map: Mapping[str, Device], name: str) -> Device | None:
    """The device of the entry covering `name` (the longest matching prefix), or None."""
    while True:
        if name in device_map:
            return device_map[name]
        if name == "":
            return None
        name = name.rsplit(".", 1)[0] if "." in name else ""


def device_for(device_map: Mapping[str, Device], name: str) -> Device:
    """The device that `device_map` gives the tensor or module `name`."""
    device = _lookup(device_map, name)
    if device is None:
        raise ValueError(f"The device_map does not place {name!r}; add it (or its module).")
    return normalize_device(device)


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, Device] | Device | torch.device,
    max_memory: Mapping[Device, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_buffers: bool = False,
    allow_disk: bool = False,
) -> dict[str, Device]:
    """Turn "auto" / "balanced" / "balanced_low_0" / "sequential" or one device into a map.

    What fits nowhere else is planned on "disk" (as `infer_auto_device_map` does); without
    `allow_disk` (no offload folder) that is refused with an error naming the modules.
    """
    if isinstance(device_map, Mapping):
        return {k: normalize_device(v) for k, v in device_map.items()}
    if isinstance(device_map, str) and device_map in DEVICE_MAP_STRINGS:
        budget = get_max_memory(max_memory)
        if device_map != "sequential":
            budget = get_balanced_memory(
                model, budget, no_split_module_classes, dtype,
                low_zero=device_map == "balanced_low_0",
            )  # fmt: skip
        planned = infer_auto_device_map(
            model, budget, no_split_module_classes, dtype, offload_buffers=offload_buffers
        )
        spilled = [name for name, device in planned.items() if device == "disk"]
        if spilled and not allow_disk:
            raise ValueError(
                f"device_map={device_map!r}: {spilled} do not fit in max_memory "
                f"{ {k: v for k, v in budget.items() if k != 'disk'} } and would go to disk, "
                f"which needs an offload folder. Pass offload_folder=..., or raise max_memory."
            )
        return planned
    try:
        device = normalize_device(device_map)
    except ValueError:
        raise ValueError(
            f"device_map={device_map!r} is not understood. Give a dict of module name to "
            f"device, one device ('cpu', 0, 'cuda:1'), or one of {DEVICE_MAP_STRINGS}."
        ) from None
    return {"": device}
