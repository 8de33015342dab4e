"""Where a model loaded in 8-bit or 4-bit (bitsandbytes, through transformers) may train.

Such a model carries `is_loaded_in_8bit` / `is_loaded_in_4bit` and the `hf_device_map` it was
loaded with; its quantized weights cannot move, so `prepare` checks the placement instead.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from accel._compat import _imports


def is_quantized(model: Any) -> bool:
    """True for a model transformers loaded in 8-bit or 4-bit."""
    return bool(
        getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    )


def check_quantized_placement(model: Any, device: torch.device, distributed: bool) -> None:
    """Raise ValueError where a quantized model cannot train as loaded: spread over several
    devices in a distributed run, on another device than this process's, or offloaded to the
    CPU (without a bitsandbytes that runs there) or to disk."""
    device_map = getattr(model, "hf_device_map", None)
    if not is_quantized(model) or not device_map:
        return
    devices = set(device_map.values())
    if len(devices) > 1 and distributed:
        raise ValueError(
            f"This model was loaded in 8-bit or 4-bit over the devices {sorted(map(str, devices))}; "
            "such a model cannot train in a distributed run. Run one process (naive pipeline "
            "parallelism over its devices), or load it whole on each process's device."
        )
    if len(devices) == 1:
        _check_same_device(next(iter(devices)), device)
    cpu_ok = (
        _familiar("is_bitsandbytes_multi_backend_available")()
        and not _familiar("is_xpu_available")()
    )
    if "disk" in devices or ("cpu" in devices and not cpu_ok):
        raise ValueError(
            f"This model was loaded in 8-bit or 4-bit with CPU or disk offload (device map "
            f"devices: {sorted(map(str, devices))}); it cannot train so. Load it on the training "
            "device (device_map={'': accelerator.device}), or, to train on the CPU, install a "
            "bitsandbytes build with its CPU backend."
        )


def _check_same_device(loaded: Any, device: torch.device) -> None:
    if str(loaded) in ("cpu", "disk"):
        return  # the offload rule above decides
    index = loaded if isinstance(loaded, int) else torch.device(loaded).index
    if torch.device(device.type, index) != device and (device.index is not None or index != 0):
        raise ValueError(
            f"This model was loaded in 8-bit or 4-bit on device {loaded!r} but this process "
            f"trains on {device}; load it there (device_map={{'': accelerator.device}})."
        )


def _familiar(name: str) -> Any:
    """The check `name` as the familiar module `accel.accelerator` holds it, where accelerate's
    checks live and its tests patch them (`...accelerator.is_xpu_available`); the owner's
    function while that module was never imported (nothing can have patched it then). Looked
    up, not imported: the familiar module imports the Accelerator, which imports this one."""
    familiar = sys.modules.get("accel.accelerator")
    return getattr(familiar if familiar is not None else _imports, name)
