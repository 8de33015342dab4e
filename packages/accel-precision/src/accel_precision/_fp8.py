"""fp8 prerequisites: which backend "auto" means here, and whether the device can run fp8."""

from __future__ import annotations

import importlib.util

import torch

from accel_precision._device_kinds import runs_fp8_kernels
from accel_precision._fp8_ao import AO_INSTALL
from accel_precision._fp8_te import TE_INSTALL
from accel_precision._kwargs import FP8RecipeKwargs

# fp8 tensor cores arrived with Ada (8.9) and Hopper (9.0).
MIN_FP8_CAPABILITY = (8, 9)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolve_fp8_backend(kwargs: FP8RecipeKwargs) -> str:
    """ "te" or "ao": the backend asked for, or for "auto" the first installed (TE first)."""
    if kwargs.fp8_backend != "auto":
        return kwargs.fp8_backend
    if _installed("transformer_engine"):
        return "te"
    if _installed("torchao"):
        return "ao"
    raise ImportError(
        "mixed_precision='fp8' needs TransformerEngine or torchao and neither is installed. "
        f"Install one: `{TE_INSTALL}` (CUDA) or `{AO_INSTALL}`."
    )


def check_fp8_support(device: torch.device | str | None = None) -> None:
    """Raise a RuntimeError unless `device` is a CUDA GPU of capability 8.9 or higher.

    `None` means the current CUDA device. Called when an fp8 precision is made, never at import.
    """
    dev = torch.device("cuda") if device is None else torch.device(device)
    if not runs_fp8_kernels(dev):
        raise RuntimeError(
            f"mixed_precision='fp8' needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper or "
            f"newer); the device is {dev.type!r}. Use 'bf16' here, or torchao's emulation "
            f"(AORecipeKwargs(emulate=True)) to test fp8 numerics without fp8 hardware."
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "mixed_precision='fp8' needs a CUDA GPU of compute capability >= 8.9, and no CUDA "
            "device is visible. Use 'bf16', or run on an Ada/Hopper GPU."
        )
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    cap = torch.cuda.get_device_capability(index)
    if cap < MIN_FP8_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        raise RuntimeError(
            f"mixed_precision='fp8' needs compute capability >= 8.9; cuda:{index} ({name}) has "
            f"{cap[0]}.{cap[1]}. Use 'bf16' (or 'fp16' on GPUs without bf16) on this GPU."
        )
