"""Quantizing while a checkpoint streams in: a `Placer` that turns each full-precision weight of
a bitsandbytes layer into its quantized form as it arrives.

The checkpoint reader hands over one tensor at a time (read into new memory, within the
reader's bounded buffer); the weight is quantized on its device and the full-precision copy
dropped, so the whole model never exists in full precision. An 8-bit weight the map sends to
"disk" is quantized on the main device and written to the offload folder with its row scales
(``<module>.SCB``), as accelerate does; the offload hooks build it again before each forward.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel._bnb_config import BnbQuantizationConfig
from accel_bigmodel._modeling import get_module
from accel_bigmodel._offload import offload_weight
from accel_bigmodel._placer import Placer, Plan
from accel_bigmodel._quant_params import empty_meta, quantize_param, scb_key
from accel_bigmodel._sizes import Device, torch_device


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None elsewhere (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the system. Quantizing leaves the full-precision
    tensor and the kernels' temporaries freed but still resident in glibc's heap (tens of MB
    per layer); without this the process's footprint grows with each layer until the load
    ends, instead of tracking the quantized model."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class QuantizingPlacer(Placer):
    """A `Placer` that quantizes the weights of bitsandbytes layers as they are placed."""

    def __init__(
        self,
        model: nn.Module,
        device_map: Mapping[str, Device] | None,
        offload_folder: str | os.PathLike | None,
        config: BnbQuantizationConfig,
        main_device: torch.device,
    ) -> None:
        keep = list(config.keep_in_fp32_modules or ())
        super().__init__(model, device_map, offload_folder, config.torch_dtype, False, keep)
        self.main_device = main_device
        self.quantized = {
            f"{name}.weight"
            for name, module in model.named_modules()
            if type(module).__name__ in ("Linear8bitLt", "Linear4bit")
        }

    def keep_in_place(self, name: str, plan: Plan, entry: Mapping | None) -> bool:
        """Quantized weights are always read (they change form); the others as a Placer does."""
        return name not in self.quantized and super().keep_in_place(name, plan, entry)

    def put(self, name: str, plan: Plan, value: torch.Tensor) -> None:
        if name not in self.quantized:
            super().put(name, plan, value)
            return
        owner_name, _, attr = name.rpartition(".")
        owner = get_module(self.model, owner_name)
        meta = owner._parameters[attr]
        if plan.target is None:  # to disk: quantized on the main device, then written out
            self._offload(name, owner, meta, value)
            return
        owner._parameters[attr] = quantize_param(meta, owner, value, torch_device(plan.device))
        del value
        return_freed_memory()

    def _offload(self, name: str, owner: nn.Module, meta: Any, value: torch.Tensor) -> None:
        if type(meta).__name__ != "Int8Params":
            raise ValueError(
                f"{name!r} is a 4-bit weight mapped to 'disk'; 4-bit layers are not offloaded "
                f"(as in accelerate). Map that module to a device, or pass a device_map that "
                f"sends it to 'disk' so it is kept unquantized."
            )
        param = quantize_param(meta, owner, value, self.main_device)
        offload_weight(param.data.to("cpu"), name, self.offload_folder, self.index)
        offload_weight(param.SCB.to("cpu"), scb_key(name), self.offload_folder, self.index)
        owner._parameters[name.rpartition(".")[2]] = empty_meta(param)
        del param, value
        return_freed_memory()
