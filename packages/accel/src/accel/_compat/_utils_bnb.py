"""accelerate.utils.bnb's helper that holds without bitsandbytes (the quantizing functions are
stand-ins in `_left_out`)."""

from __future__ import annotations

import torch
from torch import nn


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the first parameter (else buffer) of `parameter`; CPU when it holds none."""
    for tensor in parameter.parameters():
        return tensor.device
    for tensor in parameter.buffers():
        return tensor.device
    return torch.device("cpu")
