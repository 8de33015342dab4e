"""Swapping `nn.Linear` layers for bitsandbytes' 8-bit and 4-bit layers, and what to leave alone.

bitsandbytes is imported inside the functions that need it (it probes devices on import); a
missing one raises an ImportError naming the extra to install.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch import nn

from accel_bigmodel._bnb_config import BnbQuantizationConfig
from accel_bigmodel._modeling import find_tied_parameters, init_empty_weights

logger = logging.getLogger(__name__)
_KERNEL_PROBE = "bitsandbytes::dequantize_4bit"
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "hpu": "HPU", "mps": "MPS"}


def import_bnb() -> Any:
    """bitsandbytes, or an ImportError that names the extra to install."""
    try:
        import bitsandbytes
    except ImportError as e:
        raise ImportError(
            "Quantized loading with BnbQuantizationConfig needs bitsandbytes>=0.50: "
            "pip install 'accel-bigmodel[bnb]' (or pip install bitsandbytes)."
        ) from e
    return bitsandbytes


def check_bnb_device(device: torch.device | str | int) -> None:
    """Raise ValueError when bitsandbytes has no kernels for `device`'s type."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "meta":
        return
    import_bnb()
    key = _DISPATCH_KEYS.get(device.type)
    if key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(_KERNEL_PROBE, key):
        return
    served = [t for t, k in _DISPATCH_KEYS.items() if _has_kernel(k)]
    raise ValueError(
        f"bitsandbytes has no backend for the device {str(device)!r} on this machine; its "
        f"quantized layers run on {served}. Map the quantized modules to one of those devices "
        f"(or to 'disk' / 'cpu' to offload them)."
    )


def _has_kernel(key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(_KERNEL_PROBE, key)


def skipped(path: str, skip: list[str]) -> bool:
    """accelerate's rule: a module is left alone when a skip entry is its name or a parent's."""
    return any(key == path or f"{key}." in path for key in skip) or path.split(".")[-1] in skip


def check_skip_modules(model: nn.Module, skip: list[str], field: str) -> None:
    """Raise ValueError for entries of `skip` that name no module of `model`."""
    names = [n for n, _ in model.named_modules() if n]
    unknown = [k for k in skip if not any(n == k or k in n for n in names)]
    if unknown:
        raise ValueError(
            f"BnbQuantizationConfig.{field} names {unknown}, which match no module of "
            f"{type(model).__name__} (modules such as {names[:8]}). Give module names as "
            f"model.named_modules() spells them, e.g. 'lm_head'."
        )


def new_bnb_layer(module: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
    """The bitsandbytes layer that replaces `module` (weights not filled)."""
    bnb = import_bnb()
    has_bias = module.bias is not None
    empty = module.weight.device.type == "meta"
    with init_empty_weights() if empty else contextlib.nullcontext():
        layer = _bnb_layer(bnb, module, config, has_bias)
    layer.weight.data = module.weight.data
    if has_bias:
        layer.bias.data = module.bias.data
    layer.requires_grad_(False)
    return layer.train(module.training)


def _bnb_layer(bnb: Any, module: nn.Linear, config: BnbQuantizationConfig, has_bias: bool) -> Any:
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(
            module.in_features,
            module.out_features,
            has_bias,
            has_fp16_weights=False,
            threshold=config.llm_int8_threshold,
        )
    else:
        layer = bnb.nn.Linear4bit(
            module.in_features,
            module.out_features,
            has_bias,
            config.bnb_4bit_compute_dtype,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
        )
    return layer


def replace_layers(
    model: nn.Module, config: BnbQuantizationConfig, skip: list[str], prefix: str = ""
) -> bool:
    """Replace, in place, every `nn.Linear` of `model` not in `skip`; True if any was."""
    replaced = False
    for name, child in model.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, nn.Linear) and not skipped(path, skip):
            setattr(model, name, new_bnb_layer(child, config))
            replaced = True
        elif next(child.children(), None) is not None:
            replaced |= replace_layers(child, config, skip, f"{path}.")
    return replaced


def keys_to_not_convert(model: nn.Module) -> list[str]:
    """The modules a quantized load keeps in full precision: tied weights and the output head.

    A base model (no head, `base_model_prefix` not an attribute) without ties keeps nothing.
    """
    tied = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base = prefix is not None and not hasattr(model, prefix)
    if not tied and is_base:
        return []
    children = [n for n, _ in model.named_children()]
    last = children[-1:] if children else []
    kept = list(dict.fromkeys(tied)) + [n for n in last if n not in tied]
    return [n.removesuffix(".weight").removesuffix(".bias") for n in kept]


def is_bnb_layer(module: nn.Module, bits: int) -> bool:
    """True for a bitsandbytes `Linear4bit` (bits=4) or `Linear8bitLt` (bits=8)."""
    return type(module).__name__ == ("Linear4bit" if bits == 4 else "Linear8bitLt")
