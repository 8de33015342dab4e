"""State of models whose parameters are DTensors (FSDP2, tensor parallel, both, in stages):
plain functions the FSDP2, mesh and pipeline strategies share.

- optimizers made before sharding re-pointed at the sharded parameters (`repoint_optimizers`);
- full state dicts gathered to / loaded from the main process (`full_model_state`, ...);
- this process's shards of accumulated gradients (`local_gradients`, ...);
- norms over gradients on several meshes, and clipping (`grad_norm`, `scale_gradients`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of `t` (a DTensor's local tensor; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def repoint_optimizers(
    models: list[nn.Module],
    optimizers: list[torch.optim.Optimizer],
    wrap: Callable[[nn.Module], nn.Module],
) -> tuple[list[nn.Module], dict[int, nn.Module]]:
    """Wrap each model with `wrap` (which replaces its parameters, as `fully_shard` and tensor
    parallel do) and point the optimizers at the new parameters. Returns the wrapped models
    and, by optimizer id, the wrapped model it trains."""
    for opt in optimizers:
        if opt.state:
            raise ValueError(
                "Sharding replaces the parameters, and this optimizer already holds state for "
                "the unsharded ones (it stepped before prepare). Create the optimizer fresh, or "
                "load its state after prepare."
            )
    owners: dict[int, tuple[nn.Module, str]] = {}
    for model in models:
        for module in model.modules():
            for attr, p in module._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), (module, attr))
    wrapped = [wrap(m) for m in models]
    trained: dict[int, nn.Module] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            new = []
            for p in group["params"]:
                owner = owners.get(id(p))
                new.append(owner[0]._parameters[owner[1]] if owner else p)
            group["params"] = new
        ids = {id(p) for g in opt.param_groups for p in g["params"]}
        for model in wrapped:
            if any(id(p) in ids for p in model.parameters()):
                trained[id(opt)] = model
    return wrapped, trained


# -- full state dicts ----------------------------------------------------------------------------
def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on the main process (CPU tensors); other processes get {}. Tied
    weights come back as one tensor, so that exports write them once."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    for group in names.values():
        present = [n for n in group if n in state]
        for other in present[1:]:
            state[other] = state[present[0]]
    return state


def load_full_model_state(
    model: nn.Module, state: dict[str, torch.Tensor], device: torch.device, strict: bool = True
) -> Any:
    """Load a full state dict given on every process, or on rank 0 only (then broadcast)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    everywhere = torch.tensor([1 if state else 0], device=where)
    dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
    options = StateDictOptions(
        full_state_dict=True, strict=strict, broadcast_from_rank0=not bool(everywhere.item())
    )
    return set_model_state_dict(model, state, options=options)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state keyed by parameter names, on the main process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_full_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)


# -- accumulated gradients ------------------------------------------------------------------------
def local_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """This process's shard of the accumulated gradients (restored on the same layout)."""
    return {
        n: local(p.grad).detach().cpu() for n, p in model.named_parameters() if p.grad is not None
    }


def load_local_gradients(model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        if name not in grads:
            param.grad = None
            continue
        shard = grads[name].to(local(param).device)
        if shard.shape != local(param).shape:
            raise ValueError(
                f"the checkpoint's accumulated gradient of {name} has the shard shape "
                f"{tuple(shard.shape)}, this process holds {tuple(local(param).shape)}: a "
                f"checkpoint saved in the middle of gradient accumulation resumes only on "
                f"the same number of processes. Save at an accumulation boundary to reshard."
            )
        if isinstance(param, DTensor):
            shard = DTensor.from_local(shard, param.device_mesh, param.placements,
                                       shape=param.shape, stride=param.stride())  # fmt: skip
        param.grad = shard


# -- norms and clipping ----------------------------------------------------------------------------
def grad_norm(grads: list[torch.Tensor], norm_type: float, device: torch.device) -> torch.Tensor:
    """The norm over `grads` (DTensors of several meshes and placements, and plain tensors of
    ignored, replicated modules): each group of one mesh and placement has its norm taken
    apart (a collective on its mesh), then they are combined."""
    if not grads:
        return torch.zeros((), device=device)
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if hasattr(g, "device_mesh") else None
        groups.setdefault(key, []).append(g)
    norms = []
    for group in groups.values():
        norm = nn.utils.get_total_norm(group, norm_type)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    device = norms[0].device
    return torch.linalg.vector_norm(
        torch.stack([n.to(device, torch.float32) for n in norms]), norm_type
    )


def scale_gradients(grads: Iterable[torch.Tensor], total: torch.Tensor, max_norm: float) -> None:
    """Multiply `grads` in place so that their norm `total` becomes at most `max_norm`."""
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        shard = local(g)
        shard.mul_(coef.to(shard.device, shard.dtype))


def clip_grad_value(parameters: Iterable[nn.Parameter], clip_value: float) -> None:
    for p in parameters:
        if p.grad is not None:
            local(p.grad).clamp_(-clip_value, clip_value)
