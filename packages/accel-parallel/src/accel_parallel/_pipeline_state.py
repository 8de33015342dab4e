"""A pipeline run's model and optimizer state, under the model's own parameter names.

Each stage saves its own entries through DCP (the optimizer flattened to one entry per
parameter name), so a checkpoint loads on any layout: the same pipeline, another one, or one
process with the whole model (`load_sharded_model`, `load_flat_optimizer`). FSDP2 and mesh
checkpoints load the same way where no sharding is left (`load_sharded_optimizer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


def optim_options() -> Any:
    """DCP's state-dict options for a pipeline's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # One entry per parameter name: each stage saves its own, any layout loads them.
    return StateDictOptions(flatten_optimizer_state_dict=True)


def optim_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's optimizer state, one entry per parameter name of `model` (unwrapped)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=optim_options())


def load_sharded_model(model: nn.Module, folder: Path) -> None:
    """Load a model saved through DCP under its own names (a pipeline or FSDP2 checkpoint)
    into `model` on any layout (one process: plain tensors)."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {k: v.detach() for k, v in model.state_dict().items()}}
    dcp.load(state, checkpoint_id=folder)


def load_flat_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load an optimizer saved per parameter name (a pipeline checkpoint) into `optimizer`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer, options=optim_options())}
    dcp.load(state, checkpoint_id=folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=optim_options())


def load_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Load an optimizer an FSDP2 or mesh run saved through DCP into `optimizer` of `model`
    on any layout (one process, or DDP: whole tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def full_tensor(value: Any) -> Any:
    """A tensor gathered whole and on the CPU (DTensors), anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    return (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().cpu()


def laid_out_like(value: Any, target: Any) -> Any:
    """`value` laid out as `target` (split like a DTensor target, on its device)."""
    if not isinstance(target, torch.Tensor) or not isinstance(value, torch.Tensor):
        return value
    if hasattr(target, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(value.to(target.device), target.device_mesh, target.placements)
    return value.to(target.device)
