"""More hooks over a module tree: execution-device hooks alone, removal over submodules,
and layerwise casting (weights stored in a small dtype, upcast for each forward)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel._hooks import (
    AlignDevicesHook,
    ModelHook,
    add_hook_to_module,
    remove_hook_from_module,
)


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Detach the hooks of every submodule of `module` (and of `module` itself)."""
    remove_hook_from_module(module, recurse=True)


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: torch.device | str | int | Mapping[str, Any],
    skip_keys: list[str] | str | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Give each submodule that holds tensors a hook that moves its inputs to
    `execution_device` (weights are not touched). A mapping gives each module's device by name."""
    _attach_execution(
        module, execution_device, "", skip_keys, set(preload_module_classes or ()), tied_params_map
    )


def _attach_execution(module: nn.Module, device: Any, name: str, skip_keys: Any,
                      preload: set[str], tied: dict | None) -> None:  # fmt: skip
    target = device.get(name, device.get("")) if isinstance(device, Mapping) else device
    own = any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )
    if (
        not hasattr(module, "_hf_hook")
        and target is not None
        and (own or type(module).__name__ in preload)
    ):
        add_hook_to_module(
            module, AlignDevicesHook(target, skip_keys=skip_keys, tied_params_map=tied)
        )
    if type(module).__name__ in preload:
        return
    for child_name, child in module.named_children():
        full = f"{name}.{child_name}" if name else child_name
        _attach_execution(child, device, full, skip_keys, preload, tied)


SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d, nn.Linear,
)  # fmt: skip
"""The layers whose weights `attach_layerwise_casting_hooks` stores in a small dtype."""


class LayerwiseCastingHook(ModelHook):
    """Keep a layer's weights in `storage_dtype` and run its forward in `compute_dtype`."""

    def __init__(
        self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool = False
    ) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | list[str] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of every linear and convolution layer of `module` in `storage_dtype`
    (e.g. torch.float8_e4m3fn) and upcast them to `compute_dtype` for each forward.

    A module whose name matches a pattern (regex) in `skip_modules_pattern`, or whose class is
    in `skip_modules_classes`, is left as it is with everything inside it. When `module` itself
    is a supported layer, it gets the hook.
    """
    patterns = (
        (skip_modules_pattern,)
        if isinstance(skip_modules_pattern, str)
        else tuple(skip_modules_pattern or ())
    )
    hook_args = (storage_dtype, compute_dtype, non_blocking)
    _attach_casting(module, "", patterns, tuple(skip_modules_classes or ()), hook_args)


def _attach_casting(module: nn.Module, name: str, patterns: tuple[str, ...],
                    skip_classes: tuple[type[nn.Module], ...], hook_args: tuple) -> None:  # fmt: skip
    if (skip_classes and isinstance(module, skip_classes)) or any(
        re.search(p, name) for p in patterns
    ):
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        add_hook_to_module(module, LayerwiseCastingHook(*hook_args), append=True)
        return
    for child_name, child in module.named_children():
        full = f"{name}.{child_name}" if name else child_name
        _attach_casting(child, full, patterns, skip_classes, hook_args)
