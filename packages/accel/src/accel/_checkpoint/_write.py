"""The files of one save_state, written into its temporary folder on every process.

The optimizers first (usually the largest files, their flush overlaps the rest), then the
models (through the strategy, or through the save hooks' protocol), the schedulers, the loss
scaler and the registered objects on the writing process; then, on every process, its RNG file
and accel's process file (data positions, accumulation state, accumulated gradients).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from accel._io import weights_writer
from accel_parallel import save_object
from accel_parallel.checkpoint import (
    FORMAT_VERSION,
    SCALER_NAME,
    custom_file,
    model_name,
    optimizer_name,
    process_file,
    rng_file,
    scheduler_file,
)
from accel_state import rng_state

if TYPE_CHECKING:
    from accel._checkpoint._parts import CheckpointParts


def write_checkpoint(ck: CheckpointParts, tmp: Path, safe: bool) -> None:
    """Write every file of a checkpoint of `ck`'s objects into `tmp`."""
    writer = ck.writer
    write_full = weights_writer(safe)
    for i, opt in enumerate(ck.optimizers):
        ck.strategy.save_optimizer_files(
            opt.optimizer, tmp, optimizer_name(i), writer=writer,
            model=ck.model_of(opt.optimizer),
        )  # fmt: skip
    if ck.save_hooks:
        # The familiar hook protocol: hooks see the full state dicts and may remove
        # entries (they then save those models their own way); the rest are written.
        models = list(ck.models)
        weights = [ck.strategy.model_state_dict(m) for m in models]
        for hook in ck.save_hooks.values():
            hook(models, weights, os.fspath(tmp))
        if writer:
            for i, state in enumerate(weights):
                write_full(state, tmp / model_name(i))
    else:
        for i, model in enumerate(ck.models):
            ck.strategy.save_model_files(
                model, tmp, model_name(i), writer=writer, write_full=write_full
            )
    if writer:
        for i, sched in enumerate(ck.schedulers):
            save_object(sched.state_dict(), tmp / scheduler_file(i))
        scaler = ck.precision.state_dict()
        if scaler:
            save_object(scaler, tmp / SCALER_NAME)
        for i, obj in enumerate(ck.custom_objects):
            save_object(obj.state_dict(), tmp / custom_file(i))
    rank = ck.state.process_index
    rng = rng_state(ck.gradient_state.micro_step) | ck.strategy.rng_state()  # XLA's: xm_seed
    save_object(rng, tmp / rng_file(rank))
    save_object(process_state(ck), tmp / process_file(rank))


def process_state(ck: CheckpointParts) -> dict[str, Any]:
    """accel's per-process extras: loader positions, accumulation state and gradients."""
    state: dict[str, Any] = {
        "dataloaders": [dl.state_dict() for dl in ck.dataloaders],
        # samples per global batch: what a resume on another number of processes needs
        "dataloader_batch_sizes": [getattr(dl, "total_batch_size", None) for dl in ck.dataloaders],
        "gradient_state": ck.gradient_state.state_dict(),
    }
    if ck.gradient_state.step > 0:  # mid-accumulation: keep what was accumulated so far
        state["gradients"] = [ck.strategy.gradients_state(m) for m in ck.models]
    return state


def marker_meta(ck: CheckpointParts) -> dict[str, Any]:
    """What the completion marker records of the run that saved."""
    strategy, precision = ck.strategy, ck.precision
    return {
        "format": FORMAT_VERSION,
        "num_processes": ck.state.num_processes,
        "data_parallel_size": strategy.data_parallel_size,
        "mesh": mesh_dims(strategy),
        "models": len(ck.models),
        "optimizers": len(ck.optimizers),
        "schedulers": len(ck.schedulers),
        "dataloaders": len(ck.dataloaders),
        "custom_objects": len(ck.custom_objects),
        # as Accelerator.mixed_precision reports it
        "mixed_precision": strategy.engine_precision or precision.name,
        "iteration": ck.project_configuration.iteration,
        # replica groups (torchft): the groups' step, which a run restarted whole continues
        **({"replica_groups": strategy.run_state()} if replica_groups(strategy) else {}),
    }


def replica_groups(strategy: Any) -> bool:
    """Whether `strategy` is one of several replica groups (torchft), whose step a checkpoint
    keeps. The protocol's module is imported here, not at import: few runs have groups."""
    from accel_parallel.fault_tolerance import ReplicaGroups

    return isinstance(strategy, ReplicaGroups)


def mesh_dims(strategy: Any) -> dict[str, int] | None:
    """{dimension: size} of the strategy's device mesh (None without one)."""
    mesh = strategy.device_mesh
    names = getattr(mesh, "mesh_dim_names", None)
    if mesh is None or names is None:
        return None
    return {name: int(size) for name, size in zip(names, mesh.mesh.shape)}


def model_of(models: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> Any:
    """The prepared model whose parameters `optimizer` trains (None if there is none)."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models:
        if any(id(p) in ids for p in model.parameters()):
            return model
    return None
