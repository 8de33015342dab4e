"""The few questions accel-data asks of a device, answered in this one module.

accel-data imports nothing besides torch (any framework may reuse it), so it cannot ask
accel-state's device registry. Its device rules live here, and tools/lint/rule_devices.py
allows device-type comparisons in this module only.
"""

from __future__ import annotations

import torch


def is_host(device: torch.device) -> bool:
    """The device is host memory (where gloo's collectives run)."""
    return device.type == "cpu"


def nccl_device(device: torch.device | None) -> torch.device:
    """The device NCCL's collectives run on for a loader placed on ``device``: that GPU, else
    the current CUDA device."""
    return device if device is not None and device.type == "cuda" else torch.device("cuda")
