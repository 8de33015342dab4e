"""The few questions accel-bigmodel asks of a device, answered in this one module.

accel-bigmodel stands alone (torch, safetensors and psutil; no accel-state), so it cannot ask
accel-state's device registry. Its device rules live here, each named by the capability the
caller needs, and tools/lint/rule_devices.py allows device-type comparisons in this module only.
"""

from __future__ import annotations

import torch


def is_host(device: torch.device) -> bool:
    """The device is host memory: tensors there are plain CPU tensors, nothing to stage."""
    return device.type == "cpu"


def copies_on_side_streams(device: torch.device) -> bool:
    """Copies to the device can run on side streams from pinned host buffers, overlapping
    compute: the prefetcher and the staged reader use ``torch.cuda`` streams, so CUDA only."""
    return device.type == "cuda"


def empty_cache(device: torch.device) -> None:
    """Give the caching allocator's unused blocks of ``device`` back (CUDA's; elsewhere none)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
