"""The DCP format: `torch.distributed.checkpoint` folders, each process writing its shard.

FSDP2 and device-mesh runs save one folder per object under accelerate's names
(``pytorch_model_fsdp_<i>/`` holding ``{"model": ...}``, ``optimizer_<i>/`` holding
``{"optimizer": ...}``); a pipeline run saves each stage's entries under the model's own
names (``model_fsdp/``, the optimizer flattened to one entry per parameter name in
``optimizer_fsdp/``), so the folder loads on any layout: the same pipeline, another one, or
one process with the whole model.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_parallel._io import WRITE_THREADS, add_job, fsync_enabled, staging
from accel_state import accelerator_entry


class DCPWriter:
    """dcp.save, or, for an asynchronous checkpoint, dcp.async_save (the state is staged in
    CPU memory now, written in the background on a gloo group of its own, so that its
    collectives never interleave with the training's or another piece's), planned by
    accel's SavePlanner (torch's plan, validated in linear time: `_planners`), the
    coordinator writing accel's chunk index beside DCP's ``.metadata`` (`_index`).

    Each process writes its shard as WRITE_THREADS files from as many threads, fsynced unless
    the save runs inside `deferred_fsync(enabled=False)`. An asynchronous save stages into the
    CPU buffers the previous one used (kept per folder name): a memory copy, without faulting
    in fresh pages each time.
    """

    def __init__(self) -> None:
        self._groups: dict[str, Any] = {}
        self._stagers: dict[str, Any] = {}

    def save(self, state: dict[str, Any], folder: Path) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from accel_parallel.checkpoint._index import IndexedWriter
        from accel_parallel.checkpoint._planners import SavePlanner

        writer = IndexedWriter(folder, thread_count=WRITE_THREADS, sync_files=fsync_enabled())
        if not staging():
            dcp.save(state, storage_writer=writer, planner=SavePlanner())
            return
        # One group per piece (model, optimizer, ...): their background saves run at the same
        # time, and collectives of one group never interleave with another's.
        group = self._groups.get(folder.name)
        if group is None:
            group = self._groups[folder.name] = dist.new_group(backend="gloo")
        stager = self._stagers.get(folder.name)
        if stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            accelerator = accelerator_entry()  # pinned staging where host copies are async
            options = StagingOptions(
                use_pinned_memory=accelerator is not None and accelerator.async_copies,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
            stager = self._stagers[folder.name] = DefaultStager(options)
        future = dcp.async_save(
            state, storage_writer=writer, process_group=group, async_stager=stager,
            planner=SavePlanner(),
        )  # fmt: skip
        add_job(future.result)


# (local folder, URL): the local folder is a copy of the store prefix without its DCP data
# files, which `load` reads from the store instead, each process only the ranges it needs
_IN_STORE: contextvars.ContextVar[tuple[Path, str] | None] = contextvars.ContextVar(
    "accel_dcp_in_store", default=None
)


@contextlib.contextmanager
def dcp_data_in_store(local: Path, url: str) -> Iterator[None]:
    """Inside, a DCP folder under `local` is read from the same place under `url` (fsspec:
    torch's FsspecReader, ranged reads), its ``.metadata`` from the local copy's store."""
    token = _IN_STORE.set((local, url.rstrip("/")))
    try:
        yield
    finally:
        _IN_STORE.reset(token)


def load(state: dict[str, Any], folder: Path) -> None:
    """Fill `state` (laid out as this process holds it) from the DCP folder, in place
    (planned by accel's LoadPlanner: torch's reads, found by binary search; from a local
    folder, through accel's chunk index when the folder has one: `_index`)."""
    import torch.distributed.checkpoint as dcp

    from accel_parallel.checkpoint._planners import LoadPlanner

    in_store = _IN_STORE.get()
    if in_store is not None and folder.is_relative_to(in_store[0]):
        url = f"{in_store[1]}/{folder.relative_to(in_store[0]).as_posix()}"
        reader = getattr(dcp, "FsspecReader", None)
        if reader is None:  # torch 2.9 keeps it in a private module
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader as reader
        dcp.load(state, storage_reader=reader(url), planner=LoadPlanner())
        return
    from accel_parallel.checkpoint._index import IndexedReader

    dcp.load(state, storage_reader=IndexedReader(folder, state), planner=LoadPlanner())


# -- models -----------------------------------------------------------------------------------
def load_sharded_model(model: nn.Module, folder: Path, strict: bool = True) -> None:
    """Load a model folder FSDP2 or a mesh wrote into `model` as sharded now (DTensors)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    state = {"model": get_model_state_dict(model)}
    load(state, folder)
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=strict))


def load_whole_model(model: nn.Module, folder: Path) -> None:
    """Load a model saved through DCP under its own names (a pipeline or FSDP2 checkpoint)
    into `model` on any layout (one process: plain tensors)."""
    load({"model": {k: v.detach() for k, v in model.state_dict().items()}}, folder)


# -- optimizers ---------------------------------------------------------------------------------
def flat_options() -> Any:
    """DCP's state-dict options for an optimizer saved one entry per parameter name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def flat_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This process's optimizer state, one entry per parameter name of `model` (unwrapped)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=flat_options())


def load_flat_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load an optimizer saved per parameter name (a pipeline checkpoint) into `optimizer`."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    state = {"optimizer": flat_optimizer_state(model, optimizer)}
    load(state, folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=flat_options())


def load_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Load an optimizer an FSDP2 or mesh run saved through DCP into `optimizer` of `model`,
    on any layout (sharded now, or one process / DDP: whole tensors)."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    load(state, folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


# -- values moved between layouts ---------------------------------------------------------------
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
