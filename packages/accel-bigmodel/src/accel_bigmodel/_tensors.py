"""Small helpers over a model's tensors: offloaded weights, storages, tied groups, files.

They answer questions code written for big-model loading asks (is this module offloaded?
what is its full state dict? which tensors share storage?) with the hooks and offload
format of this package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel._hooks import AlignDevicesHook, SequentialHook
from accel_bigmodel._modeling import set_module_tensor_to_device
from accel_bigmodel._offload import _dtype_from_name

logger = logging.getLogger(__name__)


def _align_hook(module: nn.Module) -> AlignDevicesHook | None:
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
    return next((h for h in hooks if isinstance(h, AlignDevicesHook)), None)


def has_offloaded_params(module: nn.Module) -> bool:
    """True when `module` carries a hook that keeps its weights off-device between forwards."""
    hook = _align_hook(module)
    return hook is not None and bool(hook.offload)


@contextlib.contextmanager
def align_module_device(
    module: nn.Module, execution_device: torch.device | str | int | None = None
) -> Iterator[None]:
    """Inside the block, `module`'s tensors are real and on its execution device (or on
    `execution_device` when given); afterwards they go back where they were.

    A module that is not offloaded has only its own parameters moved, and only when
    `execution_device` is given.
    """
    hook = _align_hook(module)
    if hook is not None and hook.offload:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = torch.device(execution_device)
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
        return
    if execution_device is None:
        yield
        return
    where = {name: t.device for name, t in module.named_parameters(recurse=False)}
    try:
        for name in where:
            set_module_tensor_to_device(module, name, execution_device)
        yield
    finally:
        for name, device in where.items():
            set_module_tensor_to_device(module, name, device)


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a dispatched model, offloaded weights read back, all on CPU.

    Tensors still on the meta device with no offloaded copy (placeholders) are left out,
    with a warning naming them.
    """
    state = dict(model.state_dict())
    for prefix, module in model.named_modules():
        hook = _align_hook(module)
        if hook is None or not hook.offload or hook.weights_map is None:
            continue
        for key in module.state_dict():
            full = f"{prefix}.{key}" if prefix else key
            if state[full].device.type == "meta" and key in hook.weights_map:
                state[full] = hook.weights_map[key]
    placeholders = sorted(k for k, v in state.items() if v.device.type == "meta")
    if placeholders:
        logger.warning(
            "These tensors are left out of the state dict: they are on the meta device with "
            f"no offloaded copy: {placeholders}"
        )
    return {k: v.to("cpu") for k, v in state.items() if v.device.type != "meta"}


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, Any],
    device_to_put_offload: torch.device | str | int = "cpu",
) -> dict[str, Any]:
    """Fill the entries of `state_dict` that belong to `module` with its real tensors.

    `module_name` names one of its tensors ("layers.0.fc.weight"); every key of `state_dict`
    under the same parent is set. An offloaded module's weights are read back onto
    `device_to_put_offload`; a module that is not offloaded gives its tensors where they are.
    """
    root = module_name.rpartition(".")[0]
    device = device_to_put_offload if has_offloaded_params(module) else None
    if isinstance(device, int):
        device = torch.device("cuda", device)
    with align_module_device(module, device):
        for key, value in module.state_dict().items():
            full = f"{root}.{key}" if root else key
            if full in state_dict:
                state_dict[full] = value
    return state_dict


def load_offloaded_weight(
    weight_file: str | os.PathLike, weight_info: Mapping[str, Any]
) -> torch.Tensor:
    """Read one tensor written by `offload_weight` (its ``.dat`` file and its index entry)."""
    dtype = _dtype_from_name(weight_info["dtype"])
    shape = tuple(weight_info["shape"])
    numel = 1
    for dim in shape:
        numel *= dim
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.from_file(os.fspath(weight_file), shared=False, size=numel, dtype=dtype)
    return flat.reshape(shape)


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """The entries of `state_dict` that belong to any of `submodule_names`."""
    return {
        key: value
        for key, value in state_dict.items()
        if any(key == name or key.startswith(f"{name}.") for name in submodule_names)
    }


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """An identifier of the storage behind `tensor`: two views of one storage share it."""
    storage = tensor.untyped_storage()
    ptr = 0 if tensor.device.type == "meta" else storage.data_ptr()
    return tensor.device, ptr, storage.nbytes()


def check_tied_parameters_on_same_device(
    tied_params: list[list[str]], device_map: Mapping[str, Any]
) -> None:
    """Warn for each group of tied parameters that `device_map` splits across devices."""
    for group in tied_params:
        devices = {}
        for name in group:
            owner = max(
                (m for m in device_map if m == "" or name == m or name.startswith(f"{m}.")),
                key=len,
                default=None,
            )
            devices[name] = device_map.get(owner) if owner is not None else None
        if len(set(map(str, devices.values()))) > 1:
            warnings.warn(
                f"tied parameters {group} are placed on different devices {devices}; they "
                "stay tied only when their modules share one device.",
                stacklevel=2,
            )


def load_state_dict(
    checkpoint_file: str | os.PathLike, device_map: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """Read one checkpoint file (safetensors or torch) into a dict of CPU tensors."""
    path = os.fspath(checkpoint_file)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    return torch.load(path, map_location="cpu", weights_only=True)
