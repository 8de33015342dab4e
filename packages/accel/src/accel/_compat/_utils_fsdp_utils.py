"""accelerate.utils.fsdp_utils' functions: the FSDP checkpoint files, the parameters a list of
modules covers, and which submodules FSDP2 shards.

The checkpoint-file functions are those transformers' Trainer calls. The Trainer writes its
own checkpoints; under FSDP it hands the model and optimizer files to these four functions.
Each forwards to the prepared run's FSDP2 strategy (what `save_state` uses too), so the files
are those accelerate writes: with `state_dict_type="SHARDED_STATE_DICT"` one DCP folder per
object (`pytorch_model_fsdp_0`, `optimizer_0`), which loads on another number of processes;
with `FULL_STATE_DICT` one file (`pytorch_model_fsdp.bin`, `optimizer.bin`) written by the
main process. These are the names the Trainer looks for.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel._compat._utils_dataclasses import get_module_class_from_name
from accel._io import read_weights, weights_writer
from accel_parallel.checkpoint import model_name, optimizer_name


def _strategy(accelerator: Any, what: str) -> Any:
    strategy = accelerator.strategy
    if strategy.fsdp_plugin is None:
        raise ValueError(
            f"{what} needs an Accelerator that runs FSDP2 (fsdp_plugin=...); this one runs "
            f"{strategy.name!r}. Use accelerator.save_state / load_state instead."
        )
    return strategy


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
) -> None:
    """Write `model`'s FSDP2 weights under `output_dir` (every process calls it)."""
    strategy = _strategy(accelerator, "save_fsdp_model")
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    strategy.save_model_files(
        model, folder, model_name(model_index),
        writer=accelerator.is_main_process, write_full=weights_writer(False),
    )  # fmt: skip
    accelerator.wait_for_everyone()


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    model_index: int = 0,
) -> None:
    """Load what `save_fsdp_model` wrote into the prepared `model` (every process calls it)."""
    strategy = _strategy(accelerator, "load_fsdp_model")
    strategy.load_model_files(
        model, Path(input_dir), model_name(model_index), read_full=read_weights
    )


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
) -> None:
    """Write the optimizer state of the FSDP2 `model` under `output_dir`."""
    strategy = _strategy(accelerator, "save_fsdp_optimizer")
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    strategy.save_optimizer_files(
        getattr(optimizer, "optimizer", optimizer), folder, optimizer_name(optimizer_index),
        writer=accelerator.is_main_process, model=model,
    )  # fmt: skip
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
) -> None:
    """Load what `save_fsdp_optimizer` wrote into `optimizer`."""
    strategy = _strategy(accelerator, "load_fsdp_optimizer")
    strategy.load_optimizer_files(
        getattr(optimizer, "optimizer", optimizer), Path(input_dir),
        optimizer_name(optimizer_index), model=model,
    )  # fmt: skip


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


# transformers reads these two variables (`is_fsdp_enabled`, and whether only rank 0 loads the
# weights of `from_pretrained` while the others build them on the meta device)
_USE_FSDP, _RAM_EFFICIENT = "ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"


def enable_fsdp_ram_efficient_loading() -> None:
    """Tell transformers' `from_pretrained` that FSDP runs with RAM-efficient loading (only
    rank 0 reads the weights), as accelerate's environment says it."""
    os.environ.setdefault(_USE_FSDP, "True")
    os.environ[_RAM_EFFICIENT] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Tell transformers' `from_pretrained` to load the weights on every rank."""
    os.environ[_RAM_EFFICIENT] = "False"


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """The loss scaler of fp16 under FSDP2: torch's `GradScaler(**kwargs)`, which handles
    sharded (DTensor) gradients."""
    return torch.amp.GradScaler(**kwargs)


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """`named_params` under the names the model had before activation checkpointing and
    `torch.compile` wrapped its modules (no `._checkpoint_wrapped_module`, no `_orig_mod.`)."""
    out = {}
    for name, value in named_params.items():
        name = name.replace("._checkpoint_wrapped_module", "")
        name = name.removeprefix("_orig_mod.").replace("._orig_mod", "")
        out[name] = value
    return out
