"""Checking a checkpoint against this run, and restoring what each process saved.

A folder with accel's marker is checked against the objects this run prepared; one without
it is accelerate's (complete when its ``random_states_0.pkl`` is there). On another number of
processes each process takes the state of the saved process with its index, or the last one,
except for the RNG (a process that did not exist keeps its own); the data position is
converted by accel-data's `continue_data_position`.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accel._as_accelerate import is_used_as_accelerate
from accel._checkpoint._write import mesh_dims
from accel._io import load_file
from accel_data import continue_data_position
from accel_parallel.checkpoint import (
    CUSTOM_RE,
    MARKER,
    process_file,
    rng_file,
    saved_processes,
)
from accel_state import load_rng_file, set_rng_state

if TYPE_CHECKING:
    from accel._checkpoint._parts import CheckpointParts


def check_map_location(map_location: Any) -> None:
    """accelerate's accepted values for `load_state(map_location=...)`, refused as it refuses."""
    if map_location not in [None, "cpu", "on_device"]:
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, "
            f"or `'on_device'` (got {map_location!r})."
        )


def check_checkpoint(ck: CheckpointParts, source: Path) -> dict[str, Any] | None:
    """accel's marker (None for a folder accelerate wrote), after checking that the
    checkpoint is complete and holds what this run prepared."""
    marker = source / MARKER
    if not marker.exists():
        if (source / rng_file(0)).exists():  # written by accelerate: complete when its
            _check_accelerate_checkpoint(ck, source)  # last file is there
            return None
        raise FileNotFoundError(
            f"{source} is not a complete checkpoint (neither accel's {MARKER} nor "
            f"accelerate's {rng_file(0)} is there): the folder does not exist, or a save "
            f"into it was interrupted. Pass a complete checkpoint."
        )
    meta = json.loads(marker.read_text())
    expected = {
        # a checkpoint of full states or DCP shards loads on another number of processes
        "num_processes": meta.get("num_processes")
        if ck.strategy.reshardable
        else ck.state.num_processes,
        "models": len(ck.models),
        "optimizers": len(ck.optimizers),
        "schedulers": len(ck.schedulers),
        "dataloaders": len(ck.dataloaders),
        "custom_objects": len(ck.custom_objects),
    }
    differ = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
    if differ:
        detail = ", ".join(f"{k}: saved {a}, now {b}" for k, (a, b) in differ.items())
        raise ValueError(
            f"the checkpoint {source} does not match this run ({detail}). Prepare the same "
            f"objects (and register the same ones) as the run that saved it, on as many "
            f"processes."
        )
    return meta


def _check_accelerate_checkpoint(ck: CheckpointParts, source: Path) -> None:
    customs = [f.name for f in source.iterdir() if CUSTOM_RE.match(f.name)]
    if len(customs) != len(ck.custom_objects):
        raise ValueError(
            f"the checkpoint {source} holds {len(customs)} registered objects "
            f"(custom_checkpoint_<i>.pkl), this run registered {len(ck.custom_objects)}: "
            f"register the same objects as the run that saved it."
        )
    saved = saved_processes(source, None)
    if not ck.strategy.reshardable and saved != ck.state.num_processes:
        raise ValueError(
            f"the checkpoint {source} was saved by {saved} processes, this run has "
            f"{ck.state.num_processes}; under {ck.strategy.name} it resumes on as many."
        )


def load_process_state(
    ck: CheckpointParts, source: Path, meta: dict[str, Any] | None, stateful_loaders: bool
) -> None:
    """This process's RNG, data positions, accumulation state and accumulated gradients
    (`stateful_loaders`: the run's DataLoaderConfiguration.use_stateful_dataloader)."""
    saved_world = saved_processes(source, meta)
    index = ck.state.process_index
    existed = index < saved_world
    rank = min(index, saved_world - 1)
    rng = load_rng_file(source / rng_file(rank))
    extras = source / process_file(rank)
    if extras.exists():
        _load_accel_extras(ck, source, load_file(extras), meta, saved_world, stateful_loaders)
    else:  # accelerate's checkpoint: its step counter, no data position (as accelerate)
        step = int(rng.get("step", 0))
        num_steps = ck.gradient_state.num_steps
        ck.gradient_state.load_state_dict(
            {"step": step % num_steps, "micro_step": step,
             "sync_gradients": step % num_steps == 0}
        )  # fmt: skip
    if existed:
        set_rng_state(rng)
        ck.strategy.set_rng_state(rng)
    else:  # the warning points at the caller of Accelerator.load_state
        warnings.warn(
            f"load_state: process {index} did not exist in the run that saved "
            f"{source} ({saved_world} processes), so it keeps its own random state.",
            stacklevel=5,
        )


def _load_accel_extras(
    ck: CheckpointParts,
    source: Path,
    state: dict[str, Any],
    meta: dict[str, Any] | None,
    saved_world: int,
    stateful_loaders: bool,
) -> None:
    """Data positions, accumulation state and accumulated gradients (accel's extras)."""
    saved_dp = int((meta or {}).get("data_parallel_size") or saved_world)
    now_dp = ck.strategy.data_parallel_size
    same_world = saved_world == ck.state.num_processes
    notes = []
    sizes = state.get("dataloader_batch_sizes") or [None] * len(state["dataloaders"])
    # Run as accelerate (the switch on), a loader that is not stateful starts its epoch
    # afresh, as accelerate's does: scripts written for it skip the batches they consumed
    # themselves (diffusers' training examples do), and would skip them twice otherwise.
    keep_position = not is_used_as_accelerate() or stateful_loaders
    for dl, dl_state, saved_total in zip(ck.dataloaders, state["dataloaders"], sizes):
        if saved_dp != now_dp:
            now_total = getattr(dl, "total_batch_size", None)
            try:
                dl_state, note = continue_data_position(dl_state, saved_total, now_total, now_dp)
            except ValueError as error:
                msg = f"{source} was saved by {saved_dp} data-parallel ranks: {error}"
                raise ValueError(msg) from None
            notes += [note] if note else []
        if keep_position:
            dl.load_state_dict(dl_state)
    if notes and ck.state.is_main_process:
        warnings.warn(
            f"load_state: {source} was saved by {saved_dp} data-parallel ranks, this run has "
            f"{now_dp}; the data position is approximate: " + "; ".join(notes),
            stacklevel=6,
        )
    ck.gradient_state.load_state_dict(state["gradient_state"])
    for model, grads in zip(ck.models, state.get("gradients", [])):
        if not same_world:
            raise ValueError(
                f"{source} was saved in the middle of gradient accumulation by {saved_world} "
                f"processes; accumulated gradients resume only on as many processes "
                f"(this run has {ck.state.num_processes}). Save at an accumulation boundary."
            )
        ck.strategy.load_gradients_state(model, grads)


@contextlib.contextmanager
def naming_differences(source: Path, meta: dict[str, Any] | None, strategy: Any) -> Any:
    """Loading weights saved on another mesh: when the placements do not allow it, the error
    names the dimensions that differ (what the user changes to resume)."""
    saved, now = (meta or {}).get("mesh"), mesh_dims(strategy)
    try:
        yield
    except Exception as err:
        if not saved or saved == now:
            raise
        differ = ", ".join(
            f"{dim}: saved {saved.get(dim, 1)}, now {(now or {}).get(dim, 1)}"
            for dim in sorted(set(saved) | set(now or {}))
            if saved.get(dim, 1) != (now or {}).get(dim, 1)
        )
        raise RuntimeError(
            f"the checkpoint {source} was saved on another device mesh ({differ}) and its "
            f"weights do not load onto this one ({err}). Resume with the saved sizes of the "
            f"dimensions other than data parallel."
        ) from err
