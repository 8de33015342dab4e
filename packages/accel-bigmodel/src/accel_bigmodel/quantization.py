"""Quantized big-model loading: bitsandbytes 8-bit and 4-bit layers with device maps and offload.

accelerate's names (`BnbQuantizationConfig`, `load_and_quantize_model`,
`replace_with_bnb_layers`, `get_keys_to_not_convert`, `has_4bit_bnb_layers`,
`get_quantized_model_device_map`, `quantize_and_offload_8bit`) behaving as accelerate's on a
GPU, and on the CPU too, where accelerate refuses: bitsandbytes >= 0.50 runs its 8-bit and
4-bit layers there. Weights are quantized as the checkpoint streams in (one tensor at a time),
so no full-precision copy of the model is ever held. bitsandbytes is imported lazily
(``pip install 'accel-bigmodel[bnb]'``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel._ao_load import AoPlacer, import_quantize, is_torchao_config
from accel_bigmodel._auto_map import (
    DEVICE_MAP_STRINGS,
    get_balanced_memory,
    infer_auto_device_map,
    resolve_device_map,
)
from accel_bigmodel._bnb_config import BnbQuantizationConfig
from accel_bigmodel._bnb_layers import (
    check_bnb_device,
    check_skip_modules,
    import_bnb,
    is_bnb_layer,
    keys_to_not_convert,
    replace_layers,
    skipped,
)
from accel_bigmodel._checkpoint import checkpoint_files, load_with_placer
from accel_bigmodel._device_kinds import is_host
from accel_bigmodel._device_map import check_device_map
from accel_bigmodel._dispatch import dispatch_model
from accel_bigmodel._header import read_safetensors_header
from accel_bigmodel._modeling import get_module, init_empty_weights, set_module_tensor_to_device
from accel_bigmodel._offload import offload_weight
from accel_bigmodel._placer import Placer
from accel_bigmodel._quant_load import QuantizingPlacer, quantize_param
from accel_bigmodel._quant_params import empty_meta, scb_key
from accel_bigmodel._reader import CheckpointReader
from accel_bigmodel._sizes import Device, normalize_device, torch_device

__all__ = [
    "BnbQuantizationConfig",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "get_quantized_model_device_map",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
    "quantize_and_offload_8bit",
    "replace_with_bnb_layers",
]

logger = logging.getLogger(__name__)
QUANTIZED_READER = CheckpointReader(backend="accel", map_cached=False, buffer_size="64MiB")
"""Every tensor read into new memory, at most 64 MiB of them (or one larger tensor) in flight,
then quantized and dropped: no map of a whole shard stays resident while it is quantized."""


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the first parameter (else buffer) of `parameter`; CPU when it holds none."""
    for tensor in parameter.parameters():
        return tensor.device
    for tensor in parameter.buffers():
        return tensor.device
    return torch.device("cpu")


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """The modules a quantized load keeps in full precision: tied weights and the output head."""
    return keys_to_not_convert(model)  # reads names and ties only: nothing is copied


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> nn.Module:
    """Replace each `nn.Linear` of `model` (but those in `modules_to_not_convert`) in place by
    bitsandbytes' `Linear8bitLt` or `Linear4bit`, as `bnb_quantization_config` says."""
    prefix = ".".join(current_key_name or ())
    replaced = replace_layers(
        model, bnb_quantization_config, list(modules_to_not_convert or ()), prefix and prefix + "."
    )
    if not replaced:
        logger.warning(
            f"No nn.Linear of {type(model).__name__} was replaced: it has none outside "
            f"{modules_to_not_convert}, so nothing is quantized (GPT-2-style Conv1D layers are "
            f"not nn.Linear)."
        )
    return model


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """True if `model` holds a bitsandbytes `Linear4bit`."""
    import_bnb()
    return any(is_bnb_layer(m, 4) for m in model.modules())


def _not_converted(config: BnbQuantizationConfig) -> list[str]:
    return list(config.skip_modules or ()) + list(config.keep_in_fp32_modules or ())


def _main_device(device_map: Mapping[str, Device]) -> torch.device:
    real = [d for d in device_map.values() if d not in ("cpu", "disk")]
    if not real:
        return torch.device("cpu")
    return torch_device(sorted(real, key=str)[0])


def _default_device() -> Device:
    if torch.cuda.is_available():
        return torch.cuda.current_device()
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return f"xpu:{torch.xpu.current_device()}"
    return "cpu"  # accelerate refuses here; bitsandbytes >= 0.50 runs on the CPU


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: str | Mapping[str, Device] | None = None,
    max_memory: Mapping[Device, int | float | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, Device]:
    """The device map of a quantized load: the whole model on the first GPU (the CPU without
    one) when None, a planned one for "auto" / "balanced" / "balanced_low_0" / "sequential"
    (quantized layers counted at their quantized size), or `device_map` itself. 4-bit layers
    may not be offloaded (as in accelerate): a planned map that would do so raises."""
    config = bnb_quantization_config
    if device_map is None:
        device_map = {"": _default_device()}
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRINGS:
            raise ValueError(
                f"device_map={device_map!r} is not understood; a string must be one of "
                f"{list(DEVICE_MAP_STRINGS)}."
            )
        kept = _not_converted(config)
        fp32 = list(config.keep_in_fp32_modules or ())
        special: dict[str, torch.dtype | str] = {}
        for name, _ in model.named_parameters():
            if any(m in name for m in kept):
                special[name] = (
                    torch.float32 if any(m in name for m in fp32) else config.torch_dtype
                )
        kwargs: dict[str, Any] = {
            "special_dtypes": special,
            "no_split_module_classes": no_split_module_classes,
            "dtype": config.target_dtype,
        }
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model, max_memory, low_zero=device_map == "balanced_low_0", **kwargs
            )
        device_map = infer_auto_device_map(model, max_memory, **kwargs)
    device_map = {k: normalize_device(v) for k, v in device_map.items()}
    _check_offloaded(model, config, device_map)
    return device_map


def _offloaded(device_map: Mapping[str, Device]) -> list[str]:
    """The map's keys whose modules run elsewhere: "disk", and "cpu" when a GPU is the main one."""
    on_gpu = not is_host(_main_device(device_map))
    return [k for k, v in device_map.items() if v == "disk" or (v == "cpu" and on_gpu)]


def _check_offloaded(
    model: nn.Module, config: BnbQuantizationConfig, device_map: Mapping[str, Device]
) -> None:
    """Refuse offloaded 4-bit layers and devices bitsandbytes cannot run on."""
    kept = _not_converted(config)
    modules = dict(model.named_modules())
    offloaded = [k for k in _offloaded(device_map) if k not in kept and k in modules]
    quantized = [k for k in offloaded if any(is_bnb_layer(m, 4) for m in modules[k].modules())]
    if quantized:
        raise ValueError(
            f"The device map offloads the 4-bit modules {quantized[:8]} to the CPU or the disk; "
            f"4-bit layers run only where they are placed. Give max_memory room for the "
            f"quantized model, or pass a device_map dict that offloads those modules: they are "
            f"then kept in torch_dtype, unquantized."
        )
    for device in {v for v in device_map.values() if v != "disk"}:
        if any(k not in kept for k, v in device_map.items() if v == device):
            check_bnb_device(device)


def _prepare_skips(model: nn.Module, config: BnbQuantizationConfig, device_map: Any) -> list[str]:
    """The modules left unquantized (config.skip_modules is filled in, as accelerate does)."""
    if config.skip_modules is None:
        config.skip_modules = get_keys_to_not_convert(model)
    else:
        check_skip_modules(model, config.skip_modules, "skip_modules")
    if config.keep_in_fp32_modules is None:
        config.keep_in_fp32_modules = []
    else:
        check_skip_modules(model, config.keep_in_fp32_modules, "keep_in_fp32_modules")
    if config.load_in_4bit and isinstance(device_map, Mapping) and len(device_map) > 1:
        normalized = {k: normalize_device(v) for k, v in device_map.items()}
        config.skip_modules.extend(
            k for k in _offloaded(normalized) if k not in config.skip_modules
        )
    return config.skip_modules + config.keep_in_fp32_modules


def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: str | os.PathLike | None = None,
    device_map: str | Mapping[str, Device] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Mapping[Device, int | float | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantize `model` with bitsandbytes as `bnb_quantization_config` says, and place it.

    A model on the meta device (built under `init_empty_weights`) gets its weights from
    `weights_location` (a file, an index, or a folder), quantized as they stream in, placed as
    `device_map` says (None: the first GPU, else the CPU); 8-bit modules mapped to "disk" (or
    to "cpu" beside a GPU) are quantized and offloaded with their row scales and run through
    the offload hooks; 4-bit modules in a device_map dict that offloads them stay unquantized.
    A model with weights is quantized in place and moved to the GPU (the CPU without one).
    `offload_state_dict` is accepted for accelerate's signature (nothing is staged).

    accel also takes a torchao config in place of `bnb_quantization_config`
    (`Int8WeightOnlyConfig()`, `IntxWeightOnlyConfig(weight_dtype=torch.int4, ...)`): each
    `nn.Linear` but the head is quantized by torchao as its weight arrives; "disk" layers stay
    unquantized.
    """
    del offload_state_dict
    config = bnb_quantization_config
    if is_torchao_config(config):
        return _load_torchao(
            model, config, weights_location, device_map, no_split_module_classes, max_memory,
            offload_folder,
        )  # fmt: skip
    if not isinstance(config, BnbQuantizationConfig):
        raise TypeError(
            f"bnb_quantization_config is a {type(config).__name__}; pass a "
            f"BnbQuantizationConfig(load_in_8bit=True) or (load_in_4bit=True), or a torchao "
            f"config such as torchao.quantization.Int8WeightOnlyConfig()."
        )
    import_bnb()
    not_converted = _prepare_skips(model, config, device_map)
    model.is_loaded_in_4bit = config.load_in_4bit
    model.is_loaded_in_8bit = config.load_in_8bit
    if get_parameter_device(model).type != "meta":
        return _quantize_loaded(model, config, not_converted, device_map)
    files = _files(model, weights_location)
    with init_empty_weights():
        replace_with_bnb_layers(model, config, modules_to_not_convert=not_converted)
    device_map = get_quantized_model_device_map(
        model, config, device_map, max_memory, no_split_module_classes
    )
    check_device_map(model, device_map)
    if "disk" in device_map.values() and offload_folder is None:
        raise ValueError(
            f"The device map sends {[k for k, v in device_map.items() if v == 'disk'][:8]} to "
            f"'disk' but offload_folder is None; pass offload_folder='some/folder'."
        )
    placer = QuantizingPlacer(model, device_map, offload_folder, config, _main_device(device_map))
    _check_weights_match(placer, placer.quantized, files)
    load_with_placer(placer, os.fspath(weights_location), files, QUANTIZED_READER, None, False)
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder)


def _files(model: nn.Module, weights_location: str | os.PathLike | None) -> list[str]:
    if weights_location is None:
        raise ValueError(
            f"{type(model).__name__} is on the meta device and weights_location is None: pass "
            f"the checkpoint (a file, an index json, or the folder holding it) to load from."
        )
    return checkpoint_files(weights_location)


def _load_torchao(
    model: nn.Module,
    config: Any,
    weights_location: str | os.PathLike | None,
    device_map: str | Mapping[str, Device] | None,
    no_split_module_classes: list[str] | None,
    max_memory: Mapping[Device, int | float | str] | None,
    offload_folder: str | os.PathLike | None,
) -> nn.Module:
    """`load_and_quantize_model` with a torchao config: weight-only quantization of each
    `nn.Linear` (but the head and tied weights) as its weight arrives; see `_ao_load`."""
    skip = get_keys_to_not_convert(model)
    if get_parameter_device(model).type != "meta":
        model.to(_single(_default_device() if device_map is None else device_map))
        import_quantize()(model, config, filter_fn=_ao_filter(skip))
        return model
    files = _files(model, weights_location)
    device_map = resolve_device_map(
        model, {"": _default_device()} if device_map is None else device_map, max_memory,
        no_split_module_classes, allow_disk=offload_folder is not None,
    )  # fmt: skip
    check_device_map(model, device_map)
    placer = AoPlacer(model, device_map, offload_folder, config, skip)
    _check_weights_match(placer, set(), files)
    load_with_placer(placer, os.fspath(weights_location), files, QUANTIZED_READER, None, False)
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder)


def _ao_filter(skip: list[str]) -> Any:
    return lambda module, name: isinstance(module, nn.Linear) and not skipped(name, skip)


def _check_weights_match(placer: Placer, quantized: set[str], files: list[str]) -> None:
    """Raise ValueError, before reading any weight, when the checkpoint's tensors do not fit the
    model: a shape that differs, a quantized layer's weight that is absent, or no name in common.
    Names the model lacks alone are only warned about after loading (as accelerate does)."""
    stored = {
        s.name: tuple(s.shape)
        for path in files
        if path.endswith(".safetensors")
        for s in read_safetensors_header(path)
    }
    if not stored:  # .bin / .pt shards: their names are known only once loaded
        return
    bad = []
    for name, shape in sorted(stored.items()):
        current = placer.expected.get(name)
        if current is None:
            continue
        want = _linear_shape(placer.model, name) if name in quantized else current.shape
        if shape != tuple(want):
            bad.append(f"{name}: {list(shape)} vs {list(want)}")
    missing = sorted(n for n in quantized if n not in stored)
    if bad or missing or not set(stored) & set(placer.expected):
        raise ValueError(
            f"The weights at {os.path.dirname(files[0])} do not match "
            f"{type(placer.model).__name__}: shapes (stored vs the model's) {bad[:5]}, weights "
            f"of quantized layers missing {missing[:5]}, stored names such as "
            f"{sorted(stored)[:3]}. Pass the checkpoint saved from this model's definition."
        )


def _linear_shape(model: nn.Module, name: str) -> tuple[int, int]:
    layer = get_module(model, name.rpartition(".")[0])
    return (layer.out_features, layer.in_features)


def _quantize_loaded(
    model: nn.Module, config: BnbQuantizationConfig, not_converted: list[str], device_map: Any
) -> nn.Module:
    """Quantize a model that holds its weights, in place, on the GPU (else the CPU)."""
    logger.warning(
        "Quantizing a model that holds its weights keeps a full-precision copy in memory while "
        "it converts; build it under init_empty_weights and pass weights_location instead."
    )
    replace_with_bnb_layers(model, config, modules_to_not_convert=not_converted)
    fp32 = list(config.keep_in_fp32_modules or ())
    for name, module in model.named_modules():
        keep = any(m in name for m in fp32)
        for param in module.parameters(recurse=False):
            if keep:
                param.data = param.data.to(torch.float32)
            elif torch.is_floating_point(param) and not _is_bnb_weight(param):
                param.data = param.data.to(config.torch_dtype)
    device = _single(_default_device() if device_map is None else device_map)
    check_bnb_device(device)
    for module in model.modules():
        if is_bnb_layer(module, 8) or is_bnb_layer(module, 4):
            weight = module.weight
            value = weight.data.to(config.torch_dtype)
            module._parameters["weight"] = quantize_param(weight, module, value, device)
    return model.to(device)


def _is_bnb_weight(param: torch.Tensor) -> bool:
    return type(param).__name__ in ("Int8Params", "Params4bit")


def _single(device_map: Any) -> torch.device:
    """The one device a model that holds its weights goes to."""
    if isinstance(device_map, Mapping):
        devices = set(device_map.values())
        device = devices.pop() if len(devices) == 1 else "disk"
    elif isinstance(device_map, str) and device_map in DEVICE_MAP_STRINGS:
        device = _default_device()
    else:
        device = device_map
    device = normalize_device(device)
    if device == "disk":
        raise ValueError(
            f"device_map={device_map!r} for a model that holds its weights must name one device; "
            f"to offload, build the model under init_empty_weights and pass weights_location."
        )
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def quantize_and_offload_8bit(
    model: nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype,
    offload_folder: str | os.PathLike,
    offload_index: dict,
    fp16_statistics: torch.Tensor | None,
) -> None:
    """Quantize the 8-bit weight `param_name` of `model` (unless `fp16_statistics` says it is
    already) and write it and its row scales to `offload_folder`; the module keeps a meta
    tensor. accelerate quantizes on GPU 0; here on the GPU when there is one, else the CPU."""
    owner_name, _, attr = param_name.rpartition(".")
    owner = get_module(model, owner_name)
    if fp16_statistics is None:
        device = _single(_default_device())
        meta = owner._parameters[attr]
        quantized = quantize_param(meta, owner, param.to(new_dtype), device)
        data, scb = quantized.data, quantized.SCB
        owner._parameters[attr] = empty_meta(quantized)
    else:
        data, scb = param, fp16_statistics
        set_module_tensor_to_device(model, param_name, "meta", value=torch.empty(param.shape))
    offload_weight(data.to("cpu"), param_name, offload_folder, index=offload_index)
    offload_weight(scb.to("cpu"), scb_key(param_name), offload_folder, index=offload_index)
