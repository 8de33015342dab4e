"""Building and editing modules tensor by tensor: empty init, placement, tied weights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def init_on_device(
    device: torch.device | str | int, include_buffers: bool | None = None
) -> Iterator[None]:
    """Create the parameters (and, with `include_buffers`, the buffers) of new modules on `device`.

    Modules built inside the block are registered as usual; each parameter is moved to
    `device` as it is registered, so nothing of the model's size is allocated elsewhere.
    """
    device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    old_parameter = nn.Module.register_parameter
    old_buffer = nn.Module.register_buffer

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        old_parameter(module, name, param)
        current = module._parameters[name]
        if current is not None and current.device != device:  # a tie to a moved one stays
            kwargs = dict(current.__dict__) if type(current) is not nn.Parameter else {}
            kwargs["requires_grad"] = current.requires_grad
            module._parameters[name] = type(current)(current.to(device), **kwargs)

    def register_buffer(
        module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        old_buffer(module, name, tensor, persistent=persistent)
        if tensor is not None and tensor.device != device:
            module._buffers[name] = module._buffers[name].to(device)

    nn.Module.register_parameter = register_parameter
    if include_buffers:
        nn.Module.register_buffer = register_buffer
    try:
        yield
    finally:
        nn.Module.register_parameter = old_parameter
        nn.Module.register_buffer = old_buffer


def init_empty_weights(include_buffers: bool = False) -> contextlib.AbstractContextManager[None]:
    """Build a model without allocating its weights: parameters land on the meta device.

    Buffers stay real (they are usually small and computed in ``__init__``, e.g. rotary
    tables) unless `include_buffers`. Load weights afterwards with `load_checkpoint_in_model`.
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


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: torch.device | str | int,
    value: torch.Tensor | None = None,
    dtype: torch.dtype | str | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Put the tensor `tensor_name` (e.g. "layers.0.fc.weight") of `module` on `device`.

    With `value`, that tensor replaces the current one (cast to `dtype`, or to the current
    dtype for floating values); a parameter stays a parameter with its requires_grad.
    `fp16_statistics` and `tied_params_map` are accepted for signature compatibility.
    """
    del fp16_statistics, tied_params_map
    owner_name, _, name = tensor_name.rpartition(".")
    owner = get_module(module, owner_name)
    if name not in owner._parameters and name not in owner._buffers:
        raise ValueError(f"{type(owner).__name__} ({owner_name!r}) has no tensor named {name!r}.")
    is_param = name in owner._parameters
    old = owner._parameters[name] if is_param else owner._buffers[name]
    if isinstance(device, int):
        device = torch.device("cuda", device)
    if value is None:
        if old is None:
            return
        if old.device.type == "meta" and torch.device(device).type != "meta":
            raise ValueError(
                f"{tensor_name!r} is on the meta device (no data); pass value= to load it "
                f"onto {device}."
            )
        value = old
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)
    elif (
        dtype is None and old is not None and old.is_floating_point() and value.is_floating_point()
    ):
        value = value.to(old.dtype)
    value = value.to(device)
    if is_param:
        if not isinstance(value, nn.Parameter):
            grad = (old.requires_grad if old is not None else True) and value.is_floating_point()
            value = nn.Parameter(value, requires_grad=grad)
        owner._parameters[name] = value
    else:
        owner._buffers[name] = value


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
