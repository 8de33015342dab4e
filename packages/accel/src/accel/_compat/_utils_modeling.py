"""accelerate.utils.modeling's helpers that accel-bigmodel does not export: the grad scaler and
autocast for this machine, tied-weight and PEFT checks, and loading offloaded weights."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> torch.amp.GradScaler:
    """A GradScaler for this machine's accelerator (CPU when there is none)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.amp.GradScaler(device, **kwargs)


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: Any = None
) -> Any:
    """torch.autocast for this machine's device when `native_amp`, else a null context."""
    import contextlib

    if not native_amp:
        return contextlib.nullcontext()
    from accel_state import PartialState

    state = PartialState()
    extra = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtype = (
        torch.float16 if os.environ.get("ACCELERATE_MIXED_PRECISION") == "fp16" else torch.bfloat16
    )
    return torch.autocast(device_type=state.device.type, dtype=dtype, **extra)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """True when `model`'s config asks for tied word embeddings (transformers models)."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False)) and hasattr(
        model, "get_output_embeddings"
    )


def load_offloaded_weights(
    model: nn.Module, index: dict[str, dict], offload_folder: str | os.PathLike
) -> None:
    """Load each weight listed in an offload `index` from `offload_folder` into `model`."""
    from accel_bigmodel import load_offloaded_weight, set_module_tensor_to_device

    for name, info in index.items():
        path = os.path.join(offload_folder, info.get("file", f"{name}.dat"))
        set_module_tensor_to_device(model, name, "cpu", value=load_offloaded_weight(path, info))


def is_peft_model(model: Any) -> bool:
    """True for a PEFT model (checked by class, without importing peft)."""
    return any(cls.__name__ == "PeftModel" for cls in type(model).__mro__)
