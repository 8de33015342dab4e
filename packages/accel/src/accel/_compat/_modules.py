"""Questions about a model's structure that accelerate's helpers answer: which class is
named X, which layers repeat, which linear layers come first and last, which parameters a
list of modules (or a name pattern) covers, and which submodules FSDP2 should shard."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class of the first submodule of `module` (itself included, depth first) whose class
    is called `name`; None when there is none."""
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    return None


def get_parameters_from_modules(
    modules: Iterable[nn.Module] | str | None, model: nn.Module, device: Any
) -> set[nn.Parameter]:
    """The parameters of `modules`: a list of modules, or a regular expression matched in full
    against the qualified names of `model`'s submodules (those are moved to `device` first)."""
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        modules = [m.to(device) for n, m in model.named_modules() if pattern.fullmatch(n)]
    return {p for m in modules for p in m.parameters()}


def _policy_name(policy: Any) -> str | None:
    if isinstance(policy, functools.partial):
        policy = policy.func
    if isinstance(policy, str):
        return policy.lower()
    name = getattr(policy, "__name__", None)
    aliases = {
        "transformer_auto_wrap_policy": "transformer_based_wrap",
        "size_based_auto_wrap_policy": "size_based_wrap",
    }
    return aliases.get(name) if getattr(policy, "__module__", "").startswith("torch.") else None


def fsdp2_prepare_auto_wrap_policy(
    fsdp2_plugin: Any, model: nn.Module
) -> Callable[[nn.Module], bool] | None:
    """The `module -> bool` test saying which submodules get their own FSDP2 shard group, from
    the plugin's `auto_wrap_policy`: transformer-based (the classes named in
    `transformer_cls_names_to_wrap`, else the model's `_no_split_modules`), size-based (more
    than `min_num_params` parameters); None for any other policy."""
    kind = _policy_name(fsdp2_plugin.auto_wrap_policy)
    if kind == "transformer_based_wrap":
        names = fsdp2_plugin.transformer_cls_names_to_wrap
        if names is None:
            names = list(getattr(model, "_no_split_modules", None) or [])
        classes = []
        for name in names:
            cls = get_module_class_from_name(model, name)
            if cls is None:
                raise ValueError(
                    f"transformer_cls_names_to_wrap names {name!r}, which no submodule of the "
                    f"model is; name a class the model contains."
                )
            classes.append(cls)
        wrap = tuple(classes)

        def by_class(module: nn.Module) -> bool:
            module = getattr(module, "_checkpoint_wrapped_module", module)
            return bool(wrap) and isinstance(module, wrap)

        return by_class
    if kind == "size_based_wrap":
        threshold = int(fsdp2_plugin.min_num_params or 0)

        def by_size(module: nn.Module) -> bool:
            return sum(p.numel() for p in module.parameters()) > threshold

        return by_size
    return None


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the first parameter (else buffer) of `parameter`; CPU when it holds none."""
    for tensor in parameter.parameters():
        return tensor.device
    for tensor in parameter.buffers():
        return tensor.device
    return torch.device("cpu")
