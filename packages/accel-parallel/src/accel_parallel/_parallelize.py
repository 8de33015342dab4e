"""Applying FSDP2 and activation checkpointing: plain functions of a module, a mesh and the
plugin's settings, which the FSDP2, mesh and pipeline strategies compose (tensor parallel is
`accel_parallel._tp.apply_tensor_parallel`, the same shape).

FSDP2 shards each unit (chosen by the plugin's auto-wrap policy, children first) and then the
root with `fully_shard`: their parameters become DTensors sharded on dim 0 over the mesh.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_state import accelerator_entry

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).replace("torch.", "")
    dtype = getattr(torch, name, None) or _DTYPES.get(name)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"mixed_precision_policy dtype {value!r} is not a torch dtype name.")
    return dtype


def mixed_precision_policy(plugin: FullyShardedDataParallelPlugin, mixed_precision: str) -> Any:
    """FSDP2's MixedPrecisionPolicy: the plugin's, else one for the run's mixed precision
    (parameters gathered in the low precision, gradients reduced in float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = plugin.mixed_precision_policy
    if isinstance(policy, MixedPrecisionPolicy):
        return policy
    if isinstance(policy, dict):
        fields = {k: _dtype(v) if k.endswith("dtype") else v for k, v in policy.items()}
        return MixedPrecisionPolicy(**fields)
    if policy is not None:
        raise TypeError(
            f"mixed_precision_policy must be a MixedPrecisionPolicy, a dict or None, not "
            f"{type(policy).__name__}."
        )
    dtype = _DTYPES.get(mixed_precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def offload_policy(plugin: FullyShardedDataParallelPlugin) -> Any:
    """FSDP2's offload policy: parameters on the CPU with the plugin's `cpu_offload`."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not plugin.cpu_offload:
        return OffloadPolicy()
    accelerator = accelerator_entry()  # pinned host memory where copies to it are async
    return CPUOffloadPolicy(pin_memory=accelerator is not None and accelerator.async_copies)


def fsdp_units(model: nn.Module, plugin: FullyShardedDataParallelPlugin) -> list[nn.Module]:
    """The submodules that get their own shard group, in post-order (children first)."""
    policy = plugin.auto_wrap_policy
    if policy == "no_wrap":
        return []
    if policy == "transformer_based_wrap":
        names = plugin.transformer_cls_names_to_wrap or list(
            getattr(model, "_no_split_modules", None) or []
        )
        if not names:
            return []
        found = {type(m).__name__ for m in model.modules()}
        missing = [n for n in names if n not in found]
        if missing and plugin.transformer_cls_names_to_wrap:
            raise ValueError(
                f"transformer_cls_names_to_wrap names {missing}, which the model does not "
                f"contain; its module classes are {sorted(found)}."
            )
        return [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if policy == "size_based_wrap":
        return _size_units(model, int(plugin.min_num_params or 0))
    return [m for m in model.modules() if m is not model and _call_policy(policy, m)]


def _size_units(model: nn.Module, minimum: int) -> list[nn.Module]:
    chosen: list[nn.Module] = []

    def visit(module: nn.Module) -> int:
        """Parameters of `module` not yet in a chosen unit."""
        left = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            left += visit(child)
        if module is not model and left >= minimum:
            chosen.append(module)
            return 0
        return left

    visit(model)
    return chosen


def _call_policy(policy: Callable[..., bool], module: nn.Module) -> bool:
    """A callable policy: `fn(module)`, or FSDP1's `fn(module, recurse, nonwrapped_numel)`."""
    params = inspect.signature(policy).parameters
    if len(params) >= 3:
        numel = sum(p.numel() for p in module.parameters())
        return bool(policy(module=module, recurse=False, nonwrapped_numel=numel))
    return bool(policy(module))


def ignored_parameters(
    model: nn.Module, plugin: FullyShardedDataParallelPlugin
) -> set[nn.Parameter]:
    """The parameters of the plugin's `ignored_modules` (a name pattern, a predicate or a
    list of modules), which FSDP2 leaves unsharded."""
    spec = plugin.ignored_modules
    if spec is None:
        return set()
    if isinstance(spec, str):
        pattern = re.compile(spec)
        mods = [m for n, m in model.named_modules() if n and pattern.search(n)]
    elif callable(spec):
        mods = [m for m in model.modules() if spec(m)]
    else:
        mods = list(spec)
    return {p for m in mods for p in m.parameters()}


def apply_fsdp(
    root: nn.Module,
    units: Iterable[nn.Module],
    mesh: Any,
    plugin: FullyShardedDataParallelPlugin,
    mixed_precision: str = "no",
    ignored: set[nn.Parameter] | None = None,
) -> nn.Module:
    """Shard each of `units` (children first) and then `root` over `mesh` with `fully_shard`,
    with the plugin's resharding, mixed precision, offload and forward prefetch."""
    from torch.distributed.fsdp import fully_shard

    units = list(units)
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": plugin.reshard_after_forward,
        "mp_policy": mixed_precision_policy(plugin, mixed_precision),
        "offload_policy": offload_policy(plugin),
    }
    if ignored:
        kwargs["ignored_params"] = ignored
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(root, **kwargs)
    if plugin.forward_prefetch:
        for unit, following in itertools.pairwise(units):
            unit.set_modules_to_forward_prefetch([following])
    return root


def apply_activation_checkpointing(model: nn.Module, blocks: Iterable[nn.Module]) -> None:
    """Recompute the activations of each block (the whole model without blocks) in backward
    (torch's checkpoint, non-reentrant). The blocks keep their identity and parameter names:
    their forward runs under checkpoint. A transformers model trains without its KV cache
    (`_no_cache_in_training`)."""
    from torch.utils.checkpoint import checkpoint

    _no_cache_in_training(model)
    targets = list(blocks) or [model]
    for block in targets:
        forward = block.forward

        def run(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = run


def _no_cache_in_training(model: nn.Module) -> None:
    """A transformers model whose config says `use_cache` builds a KV cache in forward, and
    recomputing a block appends its keys to that cache a second time: the recomputed
    attention sees twice the keys and backward fails on mismatched shapes. In training its
    forward gets ``use_cache=False`` (what transformers' own gradient checkpointing does);
    eval and `generate` keep the cache."""
    config = getattr(model, "config", None)
    if not getattr(config, "use_cache", False):
        return
    try:
        takes = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return

    def no_cache(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if module.training:
            kwargs["use_cache"] = False
        return args, kwargs

    model.register_forward_pre_hook(no_cache, with_kwargs=True)
