"""Building and editing modules tensor by tensor: empty init, placement, tied weights."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accel_bigmodel._device_kinds import empty_cache
from accel_bigmodel._quant_params import is_quantized_param

ENV_INIT_INCLUDE_BUFFERS = ("ACCEL_INIT_INCLUDE_BUFFERS", "ACCELERATE_INIT_INCLUDE_BUFFERS")
"""Variables giving `include_buffers` its default when it is None ("1", "true", "yes", "on")."""


def _include_buffers_from_env() -> bool:
    values = [os.environ.get(name) for name in ENV_INIT_INCLUDE_BUFFERS]
    value = next((v for v in values if v is not None), "")
    return value.strip().lower() in ("1", "true", "t", "yes", "y", "on")


def _moved_parameter(
    param: nn.Parameter, device: torch.device, data: torch.Tensor | None = None
) -> nn.Parameter:
    """`param` (or `data` in its place) on `device`, of the same class, with its attributes
    and requires_grad."""
    extras = dict(param.__dict__)
    hf_initialized = extras.pop("_is_hf_initialized", None)
    data = (param if data is None else data).to(device)
    grad = param.requires_grad and (data.is_floating_point() or data.is_complex())
    if type(param) is nn.Parameter:
        moved = nn.Parameter(data, requires_grad=grad)
        moved.__dict__.update(extras)
    else:  # subclasses (quantized weights) take their attributes as constructor arguments
        extras["requires_grad"] = grad
        moved = type(param)(data, **extras)
    if hf_initialized is not None:
        moved._is_hf_initialized = hf_initialized
    return moved


@contextlib.contextmanager
def init_on_device(
    device: torch.device | str | int, include_buffers: bool | None = None
) -> Iterator[None]:
    """Create the parameters (and, with `include_buffers`, the buffers) of new modules on `device`.

    Modules built inside the block are registered as usual; each parameter is moved to
    `device` as it is registered, so nothing of the model's size is allocated elsewhere.
    With `include_buffers` every tensor made inside the block is made on `device` (torch's
    device context). None reads ACCEL_INIT_INCLUDE_BUFFERS / ACCELERATE_INIT_INCLUDE_BUFFERS.
    """
    device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    if include_buffers is None:
        include_buffers = _include_buffers_from_env()
    if include_buffers:
        with device:
            yield
        return
    old_parameter = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        old_parameter(module, name, param)
        current = module._parameters[name]
        if current is not None and current.device != device:  # a tie to a moved one stays
            module._parameters[name] = _moved_parameter(current, device)

    nn.Module.register_parameter = register_parameter
    try:
        yield
    finally:
        nn.Module.register_parameter = old_parameter


def init_empty_weights(
    include_buffers: bool | None = None,
) -> contextlib.AbstractContextManager[None]:
    """Build a model without allocating its weights: parameters land on the meta device.

    Buffers stay real (they are usually small and computed in ``__init__``, e.g. rotary
    tables) unless `include_buffers` (None: read from ACCEL_INIT_INCLUDE_BUFFERS or
    ACCELERATE_INIT_INCLUDE_BUFFERS). Load weights afterwards with `load_checkpoint_in_model`.
    """
    return init_on_device(torch.device("meta"), include_buffers=include_buffers)


def get_module(model: nn.Module, name: str) -> nn.Module:
    """The submodule `name` of `model` ("" is the model), with an error naming a bad part."""
    module = model
    for part in name.split(".") if name else ():
        child = getattr(module, part, None)
        if not isinstance(child, nn.Module):
            raise AttributeError(
                f"{type(module).__name__} has no submodule {part!r} (in {name!r})."
            )
        module = child
    return module


def _keeps_dtype(tensor: torch.Tensor) -> bool:
    """Integer and bool tensors (indices, masks, quantized data) are never cast to a `dtype`."""
    return not (tensor.is_floating_point() or tensor.is_complex())


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: torch.device | str | int,
    value: Any = None,
    dtype: torch.dtype | str | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put the tensor `tensor_name` (e.g. "layers.0.fc.weight") of `module` on `device`.

    With `value` (a tensor or anything `torch.tensor` takes), that replaces the current tensor,
    whose shape it must have; it is cast to `dtype`, or without one to the current tensor's
    dtype (as `load_state_dict` does). Integer and bool values are never cast to `dtype`. A
    parameter stays a parameter of its class, with its requires_grad and attributes.
    `tied_params_map` ({data_ptr: {device: tensor}}, keys made by the caller for tied weights):
    a tensor already placed on `device` for the same data is reused, not copied again, and a
    new placement is recorded. `clear_cache` frees the CUDA cache when a CUDA tensor is
    replaced. `fp16_statistics`: the row scales (SCB) of a bitsandbytes 8-bit weight whose
    int8 data is `value`; they go with it to `device`.
    """
    owner_name, _, name = tensor_name.rpartition(".")
    owner = get_module(module, owner_name)
    if name not in owner._parameters and name not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} ({owner_name!r}) has no tensor named {name!r}.")
    is_param = name in owner._parameters
    old = owner._parameters[name] if is_param else owner._buffers[name]
    tie = _tie_key(tied_params_map, value, old)
    if tie is not None and device in tied_params_map[tie]:
        (owner._parameters if is_param else owner._buffers)[name] = tied_params_map[tie][device]
        return
    _place(owner, name, is_param, old, tensor_name, device, value, dtype, non_blocking)
    placed = owner._parameters[name] if is_param else owner._buffers[name]
    if fp16_statistics is not None:
        _attach_statistics(placed, tensor_name, fp16_statistics)
    if tie is not None:
        tied_params_map[tie][device] = placed
    if clear_cache and old is not None and placed is not old:
        empty_cache(old.device)


def _attach_statistics(placed: torch.Tensor, tensor_name: str, statistics: torch.Tensor) -> None:
    """Give a bitsandbytes 8-bit weight its row scales, as accelerate does."""
    if type(placed).__name__ != "Int8Params":
        raise ValueError(
            f"fp16_statistics were given for {tensor_name!r}, a {type(placed).__name__}; they "
            f"are the row scales of a bitsandbytes 8-bit weight (Int8Params) only."
        )
    placed.SCB = statistics.to(placed.device)
    placed.CB = placed.data


def _tie_key(tied_params_map: dict | None, value: Any, old: torch.Tensor | None) -> int | None:
    if not tied_params_map:
        return None
    for tensor in (value, old):
        live = isinstance(tensor, torch.Tensor) and tensor.device.type != "meta"
        if live and tensor.data_ptr() in tied_params_map:
            return tensor.data_ptr()
    return None


def _place(
    owner: nn.Module,
    name: str,
    is_param: bool,
    old: torch.Tensor | None,
    tensor_name: str,
    device: torch.device | str | int,
    value: Any,
    dtype: torch.dtype | str | None,
    non_blocking: bool,
) -> None:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    if value is None:
        if old is None:
            return
        if old.device.type == "meta" and device.type != "meta":
            raise ValueError(
                f"{tensor_name!r} is on the meta device (no data); pass value= to load it "
                f"onto {device}."
            )
        value = old.to(device, non_blocking=non_blocking)
        if dtype is not None and device.type == "meta" and not _keeps_dtype(old):
            value = value.to(dtype)
        if value is old or (is_param and value.device == old.device and dtype is None):
            return
    else:
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        if old is not None and old.shape != value.shape and type(old).__name__ != "Params4bit":
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{name}" (which has shape '
                f"{old.shape}), this looks incorrect."
            )
        quantized = is_quantized_param(old) and _keeps_dtype(value)  # stored int8 / packed data
        if dtype is None and old is not None and not quantized:
            value = value.to(old.dtype, non_blocking=non_blocking)
        elif dtype is not None and not _keeps_dtype(value):
            value = value.to(dtype, non_blocking=non_blocking)
        value = value.to(device, non_blocking=non_blocking)
    if not is_param:
        owner._buffers[name] = value
        return
    if isinstance(old, nn.Parameter) and not isinstance(value, nn.Parameter):
        value = _moved_parameter(old, value.device, value.detach())
    elif not isinstance(value, nn.Parameter):
        value = nn.Parameter(value.detach(), requires_grad=value.is_floating_point())
    owner._parameters[name] = value


def find_tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one Parameter (e.g. embedding and LM head).

    Works on meta models too: ties are found by identity, so ties made in ``__init__`` under
    `init_empty_weights` are seen. Each group is sorted, and groups are sorted by first name.
    """
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point at the group's first parameter again."""
    for group in tied_params:
        source = _get_tensor(model, group[0])
        for name in group[1:]:
            owner_name, _, attr = name.rpartition(".")
            get_module(model, owner_name)._parameters[attr] = source


def _get_tensor(model: nn.Module, name: str) -> torch.Tensor:
    owner_name, _, attr = name.rpartition(".")
    owner = get_module(model, owner_name)
    if attr in owner._parameters:
        return owner._parameters[attr]
    return owner._buffers[attr]


def get_non_persistent_buffers(
    module: nn.Module, recurse: bool = False, fqns: bool = False
) -> set[str]:
    """Names of the buffers of `module` that its state dict leaves out (a new set).

    With `recurse`, the submodules' too: by their own short names, or by full names
    ("block.0.cache") with `fqns`.
    """
    found = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            join = fqns and prefix
            found |= {f"{prefix}.{b}" if join else b for b in sub._non_persistent_buffers_set}
    return found
