"""Planning a device map from a memory budget, the way accelerate plans it.

Devices are filled in order (GPUs, then "cpu", then "disk"). A module goes whole when it fits,
is split into its own tensors and children when it does not, and is never split when its
class is in `no_split_module_classes`. The main devices (the first GPU and the CPU, or the CPU
alone) keep room for the largest unsplittable block: an offloaded block is loaded there to run.
Tied parameters travel with the module that holds their first copy.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from accel_bigmodel._device_map import DEVICE_MAP_STRINGS, clean_device_map
from accel_bigmodel._modeling import find_tied_parameters
from accel_bigmodel._planning import (
    Entry,
    _split,
    _tied_outside,
    fallback_allocate,
    get_module_leaves,
    get_module_size_with_ties,
)
from accel_bigmodel._sizes import (
    Device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    get_max_layer_size,
    get_max_memory,
    normalize_device,
    parse_max_memory,
)

logger = logging.getLogger(__name__)


def _no_split(classes: Iterable[str] | str | None) -> list[str]:
    return [classes] if isinstance(classes, str) else list(classes or ())


def _budget(max_memory: Mapping[Device, int | float | str] | None) -> dict[Device, int]:
    return get_max_memory(None) if max_memory is None else parse_max_memory(max_memory)


class _Planner:
    """The state of one planning pass: what is left to place and what each device holds."""

    def __init__(self, model: nn.Module, budget: dict[Device, int], no_split: list[str],
                 sizes: dict[str, int], verbose: bool) -> None:  # fmt: skip
        self.budget = budget
        self.devices = list(budget) + ([] if "disk" in budget else ["disk"])
        gpus = [d for d in self.devices if d not in ("cpu", "disk")]
        self.gpus = gpus
        self.main = ["mps"] if "mps" in gpus else [gpus[0], "cpu"] if gpus else ["cpu"]
        self.no_split, self.sizes, self.verbose = no_split, sizes, verbose
        self.tied = find_tied_parameters(model)
        self.todo: list[Entry] = (
            list(model.named_parameters(recurse=False))
            + list(model.named_children())
            + list(model.named_buffers(recurse=False))
        )
        self.used = {d: 0 for d in self.devices}
        self.index = 0
        self.minimum: dict[Device, int] = {}
        self._layer()

    def _layer(self) -> None:
        modules = [(n, m) for n, m in self.todo if isinstance(m, nn.Module)]
        self.layer, self.layer_names = get_max_layer_size(modules, self.sizes, self.no_split)

    def say(self, message: str) -> None:
        if self.verbose:
            print(message)

    def split(self, index: int) -> bool:
        """Replace the entry at `index` by its tensors and children, when it may be split."""
        name, obj = self.todo[index]
        splittable = isinstance(obj, nn.Module) and type(obj).__name__ not in self.no_split
        if not splittable or not any(True for _ in obj.children()):
            return False
        self.say(f"Splitting {name}.")
        self.todo[index : index + 1] = _split(name, obj)
        self._layer()
        return True


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | float | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, Device]:
    """Plan a device map filling devices in order: GPUs, then "cpu", then "disk".

    The first GPU and the CPU keep room for the largest unsplittable block (offloaded blocks
    run there). With `fallback_allocation`, a device that the next module does not fit gets
    a later module that does, instead of staying empty. Works on meta models.
    """
    budget = _budget(max_memory)
    no_split = _no_split(no_split_module_classes)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    plan = _Planner(model, budget, no_split, sizes, verbose)
    device_map: dict[str, Device] = {}
    buffers: dict[Device, int] = {}
    while plan.todo:
        name, obj = plan.todo.pop(0)
        plan.layer_names = [
            n for n in plan.layer_names if n != name and not n.startswith(f"{name}.")
        ]
        if not plan.layer_names:
            plan._layer()
        size = sizes.get(name, 0)  # a module holding only tied tensors is sized 0
        ties = [p for p in _tied_outside(name, plan.tied) if _held(plan.todo, p)]
        device = plan.devices[plan.index]
        limit = None if device == "disk" else budget[device]
        reserved = plan.layer if device in plan.main else 0
        if limit is not None:
            limit -= reserved
        together, tied_names, tied_objs = get_module_size_with_ties(ties, size, sizes, plan.todo)
        if limit is None or plan.used[device] + together <= limit:
            plan.say(f"Putting {name}{f' and {tied_names}' if tied_names else ''} on {device}.")
            plan.used[device] += together
            device_map[name] = device
            for tied_name in tied_names:
                plan.todo = [e for e in plan.todo if e[0] != tied_name]
                device_map[tied_name] = device
            if not offload_buffers and isinstance(obj, nn.Module):
                extra = compute_module_total_buffer_size(obj, dtype, special_dtypes)
                buffers[device] = buffers.get(device, 0) + extra
            continue
        if ties and plan.used[device] + size <= limit:
            names = [n for n, _ in plan.todo]
            if any(plan.split(names.index(t)) for t in tied_names):
                plan.todo.insert(0, (name, obj))
                continue
            plan.say("None of the tied modules can be split, going to the next device.")
        if plan.used[device] + size >= limit:
            plan.todo.insert(0, (name, obj))
            if plan.split(0):
                continue
            plan.todo.pop(0)
            plan.say(f"{name} ({size} bytes) cannot be split and does not fit on {device}.")
        if plan.used[device] == 0 and fallback_allocation and device != "disk":
            room = budget[device] - max(plan.layer, together)
            found, found_obj, rest = fallback_allocate(plan.todo, sizes, room, no_split, plan.tied)
            if found is not None:
                plan.todo = [(found, found_obj), (name, obj), *rest]
                continue
        if plan.used[device] == 0:
            plan.minimum[device] = together + reserved
        plan.used[device] += reserved
        plan.index += 1
        plan.todo.insert(0, (name, obj))
    _report(plan, buffers, offload_buffers)
    return clean_device_map(device_map) if clean_result else device_map


def _held(entries: list[Entry], param: str) -> bool:
    return any(param.startswith(f"{name}.") for name, _ in entries)


def _report(plan: _Planner, buffers: dict[Device, int], offload_buffers: bool) -> None:
    """Warn when the offloaded blocks' buffers fit on no GPU; log devices left empty."""
    offloaded = buffers.get("cpu", 0) + buffers.get("disk", 0)
    if offloaded and not offload_buffers and plan.gpus:
        fits = any(
            plan.budget[g] >= offloaded + plan.used.get(g, 0) for g in plan.gpus if g in plan.budget
        )
        if not fits:
            warnings.warn(
                f"The offloaded blocks keep {offloaded} bytes of buffers on the execution GPU, "
                f"which fit on no GPU's remaining memory; if you run out of memory, pass "
                f"offload_buffers=True.",
                stacklevel=3,
            )
    if plan.minimum:
        needs = ", ".join(f"{d}: {m} bytes" for d, m in plan.minimum.items())
        logger.info(
            f"No module could be placed on these devices because of insufficient memory; each "
            f"would need at least: {needs}. Raise their max_memory to use them."
        )


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Device, int | float | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
) -> dict[Device, int]:
    """A `max_memory` that spreads `model` evenly over the GPUs instead of filling the first.

    Each GPU but the last gets an equal share plus a margin (1.25 x the largest of the first
    unsplittable block of each class and the mean leaf module). With `low_zero`, GPU 0 gets
    only what does not fit on the others (it keeps room for generation). A single measured GPU
    keeps 10% free for activations.
    """
    measured = max_memory is None
    budget = _budget(max_memory)
    gpus = [d for d in budget if d not in ("cpu", "disk") and budget[d] > 0]
    if not gpus:
        return budget
    if len(gpus) == 1:
        low_zero = False
        if measured and isinstance(gpus[0], int):
            budget[gpus[0]] = int(budget[gpus[0]] * 0.9)
            logger.info(f"Using 90% of device {gpus[0]}'s free memory for the model.")
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_gpu = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))
    per_gpu += _margin(model, sizes, _no_split(no_split_module_classes))
    indices = sorted(d for d in gpus if isinstance(d, int))
    for index in indices[:-1]:  # the last GPU keeps its whole budget, in case the margin is short
        budget[index] = min(budget[index] if low_zero and index == 0 else per_gpu, budget[index])
    if low_zero:
        rest = sizes[""] - sum(budget.get(i, 0) for i in range(1, len(gpus)))
        budget[0] = min(max(0, rest), budget[0])
    return budget


def _margin(model: nn.Module, sizes: dict[str, int], no_split: list[str]) -> int:
    """1.25 x the larger of the first block of each unsplittable class and the mean leaf."""
    block = 0
    if no_split:
        first: dict[str, int] = {}
        for name, size in sizes.items():
            if not name:
                continue
            kind = type(_resolve(model, name)).__name__
            if kind in no_split and kind not in first:
                first[kind] = size
            if len(first) == len(set(no_split)):
                break
        block = max(first.values(), default=0)
    tensors = set(get_module_leaves(sizes))
    modules = {n: s for n, s in sizes.items() if n not in tensors}
    leaves = get_module_leaves(modules)
    mean = int(sum(modules[n] for n in leaves) / max(len(leaves), 1))
    return int(1.25 * max(block, mean))


def _resolve(model: nn.Module, name: str) -> object:
    obj: object = model
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, Device] | Device | torch.device,
    max_memory: Mapping[Device, int | float | str] | None = None,
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
        budget = max_memory
        if device_map != "sequential":
            budget = get_balanced_memory(
                model, max_memory, no_split_module_classes, dtype,
                low_zero=device_map == "balanced_low_0",
            )  # fmt: skip
        planned = infer_auto_device_map(
            model, budget, no_split_module_classes, dtype, offload_buffers=offload_buffers
        )
        spilled = [name for name, device in planned.items() if device == "disk"]
        if spilled and not allow_disk:
            shown = {k: v for k, v in _budget(budget).items() if k != "disk"}
            raise ValueError(
                f"device_map={device_map!r}: {spilled} do not fit in max_memory {shown} and "
                f"would go to disk, which needs an offload folder. Pass offload_folder=..., "
                f"or raise max_memory."
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
