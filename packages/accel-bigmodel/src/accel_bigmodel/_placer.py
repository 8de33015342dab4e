"""Where each checkpoint tensor goes while loading, and putting it there.

Every reader (the concurrent one, safetensors' memory map, torch.load, the optional streamers)
feeds the same `Placer`: it matches names against the model, resolves tied names, picks the
dtype and the device, leaves "disk" tensors in place in their safetensors file when it can, and
records what was loaded, what was unexpected and the offload index.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from accel_bigmodel._device_map import device_for
from accel_bigmodel._modeling import find_tied_parameters, set_module_tensor_to_device
from accel_bigmodel._offload import dtype_name, offload_weight
from accel_bigmodel._sizes import Device


class Plan(NamedTuple):
    """What to do with one checkpoint tensor.

    `names`: the model names sharing it (tied); `want`: the dtype floating values get (None:
    keep); `target`: the name that gets the data in memory, or None when every name is on disk;
    `device`: where `target` lives.
    """

    names: list[str]
    want: torch.dtype | None
    target: str | None
    device: Device | torch.device
    position: int


class Placer:
    """Matches checkpoint tensors to `model` and places them as `device_map` says."""

    def __init__(
        self,
        model: nn.Module,
        device_map: Mapping[str, Device] | None,
        offload_folder: str | os.PathLike | None,
        dtype: torch.dtype | None,
        offload_buffers: bool,
        keep_in_fp32_modules: list[str],
    ) -> None:
        self.model, self.device_map, self.offload_folder = model, device_map, offload_folder
        self.dtype, self.offload_buffers, self.keep_fp32 = (
            dtype,
            offload_buffers,
            keep_in_fp32_modules,
        )
        self.tied = find_tied_parameters(model)
        self.aliases = {name: group for group in self.tied for name in group}
        self.expected = model.state_dict(keep_vars=True)
        self.position = {name: i for i, name in enumerate(self.expected)}
        self.buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
        self.loaded: set[str] = set()
        self.unexpected: list[str] = []
        self.index: dict[str, dict] = {}
        self.in_place: list[tuple[int, str, int, int]] = []  # (position, file, offset, nbytes)
        self.cached_files: set[str] = set()  # files the load found in the page cache

    def plan(self, name: str) -> Plan | None:
        """The plan for checkpoint tensor `name`; None (and recorded) when the model lacks it."""
        current = self.expected.get(name)
        if current is None:
            self.unexpected.append(name)
            return None
        names = self.aliases.get(name, [name])
        devices = {a: self._device_of(a) for a in names}
        in_memory = [
            a
            for a in names
            if devices[a] != "disk" or (a in self.buffers and not self.offload_buffers)
        ]
        self.loaded.update(names)
        target = in_memory[0] if in_memory else None
        device = "cpu" if target is None or devices[target] == "disk" else devices[target]
        position = min(self.position[a] for a in names)
        return Plan(names, self._want(name, current), target, device, position)

    def final_dtype(self, plan: Plan, stored: torch.dtype) -> torch.dtype:
        """The dtype a tensor stored as `stored` ends up in."""
        return plan.want if plan.want is not None and stored.is_floating_point else stored

    def keep_in_place(self, name: str, plan: Plan, entry: Mapping | None) -> bool:
        """Point the offload index at a disk tensor inside its safetensors file, if it can be."""
        if plan.target is not None or entry is None or self.offload_folder is None:
            return False
        if plan.want is not None and entry["dtype"] != dtype_name(plan.want):
            return False
        for alias in plan.names:
            self.index[alias] = dict(entry)
        nbytes = torch.empty((), dtype=getattr(torch, entry["dtype"]), device="meta").element_size()
        for dim in entry["shape"]:
            nbytes *= dim
        self.in_place.append((plan.position, entry["file"], entry["offset"], nbytes))
        return True

    def put(self, name: str, plan: Plan, value: torch.Tensor) -> None:
        """Place `value` (the data of checkpoint tensor `name`) as `plan` says."""
        if plan.target is None:
            value = value.to(self.final_dtype(plan, value.dtype))
            offload_weight(value, name, self.offload_folder, self.index)
            for alias in plan.names:
                self.index[alias] = self.index[name]
                if self.expected[alias].dtype != value.dtype:  # so hooks keep the new dtype
                    meta = torch.empty(value.shape, dtype=value.dtype, device="meta")
                    set_module_tensor_to_device(self.model, alias, "meta", meta, value.dtype)
            return
        set_module_tensor_to_device(
            self.model, plan.target, plan.device, value=value, dtype=plan.want
        )

    def warm_ranges(self) -> list[tuple[str, int, int]]:
        """The in-place disk tensors as (file, offset, nbytes), in the model's order."""
        return [(f, o, n) for _, f, o, n in sorted(self.in_place)]

    def missing(self) -> list[str]:
        return [n for n in self.expected if n not in self.loaded]

    def _want(self, name: str, current: torch.Tensor) -> torch.dtype | None:
        if not current.is_floating_point():
            return None
        if self.keep_fp32 and any(m in name.split(".") for m in self.keep_fp32):
            return torch.float32
        return self.dtype or current.dtype

    def _device_of(self, name: str) -> Device | torch.device:
        if self.device_map is not None:
            return device_for(self.device_map, name)
        current = self.expected[name]
        return "cpu" if current.device.type == "meta" else current.device
