"""Device maps: which device holds each block of a model, planned from a memory budget.

A device map is ``{module_name: device}`` where every parameter and buffer of the model falls
under exactly one key ("" covers the whole model). Devices are GPU indices, "cpu" or "disk".
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from torch import nn

from accel_bigmodel._sizes import Device, normalize_device

DEVICE_MAP_STRINGS = ("auto", "balanced", "balanced_low_0", "sequential")


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
    modules = {n for n, _ in model.named_modules()}
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    unknown = [k for k in device_map if k not in modules and k not in names]
    if unknown:  # a warning, as in accelerate: maps made for a larger variant still load
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model "
            f"({type(model).__name__}) and are ignored: {unknown}. Check the spelling against "
            f"model.named_modules().",
            UserWarning,
            stacklevel=2,
        )
    keys = sorted(k for k in device_map if k not in unknown)
    repeated = [(a, b) for a in keys for b in keys if a != b and (a == "" or b.startswith(f"{a}."))]
    if repeated:
        pairs = ", ".join(f"{a!r} contains {b!r}" for a, b in repeated[:10])
        raise ValueError(
            f"The device_map places some modules twice ({pairs}). Give each module one entry: "
            f"keep the parent or its children, not both."
        )
    # what the state dict holds must be placed (a non-persistent buffer may stay where it is)
    names = list(model.state_dict(keep_vars=True))
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
