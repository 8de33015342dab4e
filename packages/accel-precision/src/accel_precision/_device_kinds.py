"""The few questions accel-precision asks of a device, answered in this one module.

accel-precision stands alone (torch and its optional fp8 libraries; no accel-state), so it
cannot ask accel-state's device registry. Its device rules live here, and
tools/lint/rule_devices.py allows device-type comparisons in this module only.
"""

from __future__ import annotations

import torch


def runs_fp8_kernels(device: torch.device) -> bool:
    """The fp8 engines (TransformerEngine, torchao's float8 matmuls) have kernels for the
    device: CUDA GPUs only (their compute capability is checked apart)."""
    return device.type == "cuda"


def fp8_device(tensor: torch.Tensor) -> torch.device:
    """The CUDA device an fp8 engine runs ``tensor``'s work on: its own, else the current one."""
    if runs_fp8_kernels(tensor.device):
        return tensor.device
    return torch.device("cuda", torch.cuda.current_device())
