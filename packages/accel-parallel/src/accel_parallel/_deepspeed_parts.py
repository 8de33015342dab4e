"""What the DeepSpeed strategy does to a model and its optimizer around `deepspeed.initialize`:
pair each optimizer with its model, swap a torch Adam for DeepSpeedCPUAdam under optimizer
offload, mark MoE layers as ZeRO-3 leaves, and cast fp32 inputs for a bf16 / fp16 engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from accel_parallel._deepspeed_plugin import DeepSpeedPlugin, DummyOptim


def pair_optimizers(models: list[nn.Module], optimizers: list[Any]) -> dict[int, Any]:
    """{id(model): its optimizer}: the optimizer whose parameters belong to the model."""
    owners: dict[int, Any] = {}
    for optimizer in optimizers:
        ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        match = [m for m in models if any(id(p) in ids for p in m.parameters())]
        if len(match) != 1:
            raise ValueError(
                f"under DeepSpeed each optimizer trains the parameters of one model prepared in "
                f"the same call; this {type(optimizer).__name__} matches {len(match)} of them."
            )
        if id(match[0]) in owners:
            raise ValueError("under DeepSpeed a model is trained by one optimizer, not several.")
        owners[id(match[0])] = optimizer
    return owners


def cast_inputs(dtype: torch.dtype) -> Callable[..., Any]:
    """A forward pre-hook: float32 tensor inputs become the engine's dtype, so a loop written
    for fp32 data runs on a bf16 / fp16 engine without casting by hand."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return value.to(dtype)
        if isinstance(value, list | tuple):
            return type(value)(cast(v) for v in value)
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        return value

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return cast(args), cast(kwargs)

    return hook


def cpu_optimizer(optimizer: Any, plugin: DeepSpeedPlugin) -> Any:
    """A torch Adam/AdamW becomes DeepSpeedCPUAdam with the same groups and hyper-parameters
    when the optimizer state is offloaded to the CPU (DeepSpeed requires its CPU optimizer)."""
    if isinstance(optimizer, DummyOptim) or not plugin.deepspeed_config.get(
        "zero_force_ds_cpu_optimizer", True
    ):
        return optimizer
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    if isinstance(optimizer, DeepSpeedCPUAdam):
        return optimizer
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        raise ValueError(
            f"offload_optimizer_device={plugin.offload_optimizer_device!r} runs the optimizer on "
            f"the CPU with DeepSpeedCPUAdam; {type(optimizer).__name__} has no CPU version. Use "
            f"torch.optim.Adam / AdamW, DeepSpeedCPUAdam, or no optimizer offload."
        )
    if optimizer.state:
        raise ValueError(
            "the optimizer already holds state; it is replaced by DeepSpeedCPUAdam for the "
            "offload, so prepare it before its first step."
        )
    # the same group dicts: a scheduler made for `optimizer` keeps setting their lr
    return map_pytorch_optim_to_deepspeed(optimizer, optimizer.param_groups)


def map_pytorch_optim_to_deepspeed(optimizer: Any, param_groups: list | None = None) -> Any:
    """DeepSpeedCPUAdam with `optimizer`'s groups and hyper-parameters (Adam, or AdamW with
    decoupled weight decay)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = optimizer.defaults
    return DeepSpeedCPUAdam(
        param_groups if param_groups is not None else optimizer.param_groups,
        lr=defaults["lr"], betas=defaults.get("betas", (0.9, 0.999)),
        eps=defaults.get("eps", 1e-8), weight_decay=defaults.get("weight_decay", 0.0),
        adamw_mode=isinstance(optimizer, torch.optim.AdamW),
    )  # fmt: skip


def set_moe_leaves(model: nn.Module, plugin: DeepSpeedPlugin) -> None:
    names = [n.strip() for n in (plugin.transformer_moe_cls_names or "").split(",") if n.strip()]
    if not names:
        return
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    missing = sorted(set(names) - {c.__name__ for c in classes})
    if missing:
        raise ValueError(f"transformer_moe_cls_names {missing} name no module class of the model.")
    from deepspeed.utils import set_z3_leaf_modules

    set_z3_leaf_modules(model, sorted(classes, key=lambda c: c.__name__))
