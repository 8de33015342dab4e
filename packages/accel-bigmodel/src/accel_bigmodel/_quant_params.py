"""bitsandbytes' quantized parameters as the offload hooks see them.

An 8-bit (`Int8Params`) or 4-bit (`Params4bit`) weight is its integer data plus statistics: the
8-bit row scales under ``<module>.SCB`` (accelerate's key), the 4-bit quantization state under
``<module>.weight.<part>`` (bitsandbytes' own keys). Offloaded, the data and the statistics sit
in the weights map side by side; before a forward the hook takes both and builds the parameter
again on the execution device. Nothing here imports bitsandbytes: the classes are the
parameter's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

INT8_PARAM = "Int8Params"
INT4_PARAM = "Params4bit"
INT8_LINEAR = "Linear8bitLt"


def is_quantized_param(tensor: object) -> bool:
    """True for a bitsandbytes 8-bit or 4-bit weight (on any device, meta included)."""
    return type(tensor).__name__ in (INT8_PARAM, INT4_PARAM)


def scb_key(weight_name: str) -> str:
    """Where the row scales of the 8-bit weight `weight_name` are kept ("a.weight" -> "a.SCB")."""
    owner, _, _ = weight_name.rpartition(".")
    return f"{owner}.SCB" if owner else "SCB"


def stats_keys(weight_name: str, meta: torch.Tensor, keys: Iterable[str]) -> list[str]:
    """The keys among `keys` holding the statistics of the quantized weight `weight_name`."""
    if type(meta).__name__ == INT8_PARAM:
        wanted = scb_key(weight_name)
        return [k for k in keys if k == wanted]
    prefix = f"{weight_name}."
    return [k for k in keys if k.startswith(prefix)]


def empty_meta(param: nn.Parameter) -> nn.Parameter:
    """`param` on the meta device, of its class, holding no statistics (they stay offloaded)."""
    meta = param.to("meta")
    if type(meta).__name__ == INT8_PARAM:
        meta.CB, meta.SCB = None, None
    elif type(meta).__name__ == INT4_PARAM:
        meta.quant_state = None
    return meta


def quantize_param(
    meta: nn.Parameter, module: nn.Module | None, value: torch.Tensor, device: torch.device
) -> nn.Parameter:
    """`value` (full precision) as the quantized parameter class of `meta`, on `device`."""
    cls = type(meta)
    value = value.to(device)
    if cls.__name__ == "Int8Params":
        if value.dtype == torch.float32:  # bitsandbytes quantizes 8-bit weights from fp16
            value = value.to(torch.float16)
        param = cls(value, requires_grad=False, has_fp16_weights=False)
    else:
        param = cls(
            value,
            requires_grad=False,
            quant_type=meta.quant_type,
            blocksize=meta.blocksize,
            compress_statistics=meta.compress_statistics,
            quant_storage=meta.quant_storage,
            module=module,
        )
    return param.to(device)  # moving an unquantized bitsandbytes weight quantizes it


def rebuild(
    meta: nn.Parameter, name: str, data: torch.Tensor, stats: Mapping[str, torch.Tensor]
) -> nn.Parameter:
    """The quantized weight `name` on `data`'s device, from its data and its statistics.

    `stats` maps the keys `stats_keys` found to tensors already on that device. Floating
    `data` is a weight stored before quantization (transformers leaves the checkpoint's own
    tensor in place for a quantized layer it maps to disk): it is quantized here, for each
    forward, as accelerate's hooks do.
    """
    device = data.device
    if data.is_floating_point():
        return quantize_param(meta, None, data, device)
    if type(meta).__name__ == INT8_PARAM:
        param = type(meta)(data, requires_grad=False, has_fp16_weights=False)
        scb = stats.get(scb_key(name))
        if scb is None:
            raise ValueError(
                f"The offloaded 8-bit weight {name!r} has no row scales ({scb_key(name)!r}) in "
                f"the weights map; offload it with load_and_quantize_model, which writes both."
            )
        param.CB, param.SCB = data, scb
        return param
    prefix = f"{name}."
    parts = {k[len(prefix) :]: v for k, v in stats.items()}
    if not parts:
        raise ValueError(
            f"The offloaded 4-bit weight {name!r} has no quantization state ({prefix}absmax, "
            f"{prefix}quant_map, ...) in the weights map; offload it with its statistics."
        )
    return type(meta).from_prequantized(data, parts, requires_grad=False, device=device)


def release_int8_state(modules: Iterable[nn.Module]) -> None:
    """Drop the weights an 8-bit layer caches after its forward, so offloading frees them."""
    for module in modules:
        state = getattr(module, "state", None)
        if type(module).__name__ == INT8_LINEAR and state is not None:
            state.CB, state.SCB = None, None
