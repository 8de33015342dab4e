"""torchao weight-only quantization while a checkpoint streams in.

accel's own spelling, beside accelerate's bitsandbytes one: `load_and_quantize_model` given a
torchao config (`Int8WeightOnlyConfig()`, `IntxWeightOnlyConfig(weight_dtype=torch.int4, ...)`,
`Int4WeightOnlyConfig(...)` where torchao has kernels for the device) quantizes each
`nn.Linear` as soon as its weight is placed, so the full-precision copy of one layer at most
is alive. Layers the map sends to "disk" stay unquantized (torchao's tensors are not written
to the offload folder). torchao is imported lazily (``pip install 'accel-bigmodel[ao]'``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch import nn

from accel_bigmodel._bnb_layers import skipped
from accel_bigmodel._modeling import get_module
from accel_bigmodel._placer import Placer, Plan
from accel_bigmodel._quant_load import return_freed_memory
from accel_bigmodel._sizes import Device


def is_torchao_config(config: object) -> bool:
    """True for a torchao quantization config (an `AOBaseConfig`), without importing torchao."""
    return any(
        c.__name__ == "AOBaseConfig" and c.__module__.startswith("torchao")
        for c in type(config).__mro__
    )


def import_quantize() -> Any:
    """torchao's `quantize_`, or an ImportError naming the extra to install."""
    try:
        from torchao.quantization import quantize_
    except ImportError as e:
        raise ImportError(
            "Quantized loading with a torchao config needs torchao: "
            "pip install 'accel-bigmodel[ao]' (or pip install torchao)."
        ) from e
    return quantize_


class AoPlacer(Placer):
    """A `Placer` that quantizes each `nn.Linear` with torchao once its weight is in place."""

    def __init__(
        self,
        model: nn.Module,
        device_map: Mapping[str, Device] | None,
        offload_folder: str | os.PathLike | None,
        config: Any,
        skip: list[str],
    ) -> None:
        super().__init__(model, device_map, offload_folder, None, False, [])
        self.config, self.quantize = config, import_quantize()
        self.layers = {
            f"{name}.weight": name
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not skipped(name, skip)
        }

    def put(self, name: str, plan: Plan, value: Any) -> None:
        super().put(name, plan, value)
        layer = self.layers.get(name)
        if layer is not None and plan.target == name:  # in memory (disk layers stay as they are)
            self.quantize(get_module(self.model, layer), self.config)
            return_freed_memory()
