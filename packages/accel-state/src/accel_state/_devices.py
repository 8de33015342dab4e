"""The lookups of the device registry: a device's entry, every registered kind, the kinds
present here, the current accelerator's entry. Importing this module registers the built-in
kinds (``_device_kinds``); the base class and the registry are ``_device_kind``'s."""

from __future__ import annotations

import torch

import accel_state._device_kinds  # noqa: F401  (registers the built-in kinds)
from accel_state._device_kind import (
    _OTHERS,
    _REGISTRY,
    DeviceKind,
    _OtherKind,
    register_device_kind,
    unregister_device_kind,
)

__all__ = [
    "DeviceKind",
    "accelerator_entry",
    "device_entry",
    "device_kinds",
    "present_device_kinds",
    "register_device_kind",
    "unregister_device_kind",
]


def device_entry(device: torch.device | str) -> DeviceKind:
    """The entry of ``device``'s kind (a torch.device, or a string such as ``"cuda:1"`` or
    ``"cpu"``); an unregistered kind gets torch's defaults."""
    name = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    found = _REGISTRY.get(name)
    if found is None:
        found = _OTHERS.get(name)
        if found is None:
            found = _OTHERS[name] = _OtherKind(name)
    return found


def device_kinds() -> dict[str, DeviceKind]:
    """Every registered kind, by name (present here or not)."""
    return dict(_REGISTRY)


def present_device_kinds() -> list[DeviceKind]:
    """The registered kinds usable on this machine (cpu always among them)."""
    return [kind for kind in device_kinds().values() if kind.is_available()]


def accelerator_entry() -> DeviceKind | None:
    """The entry of torch's current accelerator (``torch.accelerator``), None on a machine
    without one."""
    acc = getattr(torch, "accelerator", None)
    if acc is None or not acc.is_available():
        return None
    current = acc.current_accelerator()
    return None if current is None else device_entry(current)
