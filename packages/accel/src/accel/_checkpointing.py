"""save_state / load_state: exact resume, atomic checkpoints; save_model: sharded weights.

A checkpoint is a folder in accelerate's layout (see accel._checkpoint_layout), so that either
library resumes the other's. It is written in a hidden temporary folder, every file fsynced,
then completed by a marker file (``accel_checkpoint.json``, written last) and renamed into
place. A crash at any moment leaves either the previous checkpoints untouched or a temporary
folder that `load_state()` ignores, saying so (and that accelerate never sees).

What is saved: each model's weights and each optimizer's state (through the strategy), each
scheduler, the precision scaler, registered objects; and per process: every RNG (python,
numpy, torch, accelerator), each prepared dataloader's position, the gradient accumulation
micro-step and, in the middle of an accumulation, the gradients accumulated so far.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from accel._as_accelerate import is_used_as_accelerate
from accel._checkpoint_layout import (
    CHECKPOINT_RE,
    FORMAT_VERSION,
    MARKER,
    STAGING,
    complete_checkpoints,
    indexed,
    load_file,
    load_rng_file,
    process_file,
    rng_file,
    rng_state,
    saved_processes,
    set_rng_state,
    staging_path,
)
from accel._io import read_weights, weights_writer
from accel._reshard import continue_data_position
from accel_parallel import (
    StagingBuffers,
    deferred_fsync,
    fsync_dir,
    fsync_file,
    parallel_writes,
    run_parallel,
    save_object,
    staged_writes,
)

_name = indexed
_load = load_file
_CUSTOM_RE = re.compile(r"^custom_checkpoint_\d+\.pkl$")


class CheckpointingMixin:
    """The Accelerator's checkpoint methods (it supplies the attributes used here)."""

    def _init_checkpointing(self) -> None:
        self._custom_objects: list[Any] = []
        self._save_hooks: collections.OrderedDict[int, Callable] = collections.OrderedDict()
        self._load_hooks: collections.OrderedDict[int, Callable] = collections.OrderedDict()
        self._pending_save: _AsyncSave | None = None
        # The CPU copies of the last asynchronous save, reused by the next (free_memory drops)
        self._staging_buffers = StagingBuffers()

    # -- registration ----------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (anything with state_dict / load_state_dict)."""
        bad = [
            f"Item at index {i} ({type(o).__name__})"
            for i, o in enumerate(objects)
            if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))
        ]
        if bad:
            raise ValueError(
                f"register_for_checkpointing needs objects with state_dict() and "
                f"load_state_dict(); these have not: {', '.join(bad)}. Wrap each in an object "
                f"that has both, or save it yourself."
            )
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` before the models are saved; removing a
        model's entry from `weights` skips writing it (the hook saves it its own way)."""
        handle = RemovableHandle(self._save_hooks)
        self._save_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` before the models are loaded; removing a model from
        `models` skips loading it."""
        handle = RemovableHandle(self._load_hooks)
        self._load_hooks[handle.id] = hook
        return handle

    # -- saving ------------------------------------------------------------------------------
    def _writer(self) -> bool:
        pc = self.project_configuration
        return self.is_local_main_process if pc.save_on_each_node else self.is_main_process

    def _checkpoint_root(self) -> Path:
        if self.project_dir is None:
            raise ValueError(
                "automatic_checkpoint_naming needs a project directory: pass project_dir= to "
                "the Accelerator (or ProjectConfiguration(project_dir=...))."
            )
        return Path(self.project_dir) / "checkpoints"

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        async_save: bool | None = None,
    ) -> str:
        """Save everything needed to resume exactly; returns the checkpoint folder.

        With `async_save` (default: ProjectConfiguration.async_save) it returns once every
        tensor is staged in CPU memory and writes in a background thread; see
        `wait_for_checkpoint`."""
        self.wait_for_checkpoint()
        pc = self.project_configuration
        asynchronous = pc.async_save if async_save is None else async_save
        if asynchronous and pc.save_on_each_node:
            raise NotImplementedError(
                "async_save with save_on_each_node is not supported: save synchronously, or "
                "write to a shared folder."
            )
        if pc.automatic_checkpoint_naming:
            if output_dir is not None:
                raise ValueError(
                    "automatic_checkpoint_naming is on: call save_state() without output_dir "
                    f"(got {output_dir!r})."
                )
            target = self._checkpoint_root() / f"checkpoint_{pc.iteration}"
        elif output_dir is None:
            raise ValueError(
                "save_state() needs output_dir, or ProjectConfiguration("
                "automatic_checkpoint_naming=True) with a project_dir."
            )
        else:
            target = Path(output_dir)
        tmp = staging_path(target, pc.automatic_checkpoint_naming)
        if self._writer():
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            target.parent.mkdir(parents=True, exist_ok=True)
        self.wait_for_everyone()
        meta = self._marker_meta()
        limit = pc.total_limit if pc.automatic_checkpoint_naming else None
        if asynchronous:
            with staged_writes(self._staging_buffers) as jobs:  # copied now, written later
                self._write_checkpoint(tmp, safe_serialization)
            self._pending_save = _AsyncSave(
                jobs, tmp, target, meta, limit, writer=self._writer(), rank=self.process_index,
                world=self.num_processes, fsync=pc.fsync,
            )  # fmt: skip
            if pc.automatic_checkpoint_naming:
                pc.iteration += 1
            return os.fspath(target)
        # Files are written by several threads at once, each flushed in the background.
        with deferred_fsync(enabled=pc.fsync), parallel_writes():
            self._write_checkpoint(tmp, safe_serialization)
        self.wait_for_everyone()
        if self._writer():
            _finalize(tmp, target, meta, limit, pc.fsync)
        self.wait_for_everyone()
        if pc.automatic_checkpoint_naming:
            pc.iteration += 1
        return os.fspath(target)

    def wait_for_checkpoint(self) -> None:
        """Wait until an asynchronous `save_state` is written and marked complete (on every
        process); raise its error if it failed. Does nothing when none is in flight."""
        pending = getattr(self, "_pending_save", None)
        if pending is None:
            return
        self._pending_save = None
        pending.join()
        self.wait_for_everyone()
        pending.raise_error()

    def _write_checkpoint(self, tmp: Path, safe: bool) -> None:
        writer = self._writer()
        write_full = weights_writer(safe)
        # The optimizers first: usually the largest files, their flush overlaps the rest.
        for i, opt in enumerate(self._optimizers):
            self.strategy.save_optimizer_files(
                opt.optimizer, tmp, _name("optimizer", i), writer=writer,
                model=self._model_of(opt.optimizer),
            )  # fmt: skip
        if self._save_hooks:
            # The familiar hook protocol: hooks see the full state dicts and may remove
            # entries (they then save those models their own way); the rest are written.
            models = list(self._models)
            weights = [self.get_state_dict(m) for m in models]
            for hook in self._save_hooks.values():
                hook(models, weights, os.fspath(tmp))
            if writer:
                for i, state in enumerate(weights):
                    write_full(state, tmp / _name("model", i))
        else:
            for i, model in enumerate(self._models):
                self.strategy.save_model_files(
                    model, tmp, _name("model", i), writer=writer, write_full=write_full
                )
        if writer:
            for i, sched in enumerate(self._schedulers):
                save_object(sched.state_dict(), tmp / f"{_name('scheduler', i)}.bin")
            scaler = self.precision.state_dict()
            if scaler:
                save_object(scaler, tmp / "scaler.pt")
            for i, obj in enumerate(self._custom_objects):
                save_object(obj.state_dict(), tmp / f"custom_checkpoint_{i}.pkl")
        save_object(rng_state(self.step), tmp / rng_file(self.process_index))
        save_object(self._process_state(), tmp / process_file(self.process_index))

    def _process_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "dataloaders": [dl.state_dict() for dl in self._dataloaders],
            # samples per global batch: what a resume on another number of processes needs
            "dataloader_batch_sizes": [
                getattr(dl, "total_batch_size", None) for dl in self._dataloaders
            ],
            "gradient_state": self.gradient_state.state_dict(),
        }
        if self.gradient_state.step > 0:  # mid-accumulation: keep what was accumulated so far
            state["gradients"] = [self.strategy.gradients_state(m) for m in self._models]
        return state

    def _model_of(self, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
        """The prepared model whose parameters `optimizer` trains (None if there is none)."""
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in self._models:
            if any(id(p) in ids for p in model.parameters()):
                return model
        return None

    def _marker_meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "num_processes": self.num_processes,
            "data_parallel_size": self.strategy.data_parallel_size,
            "mesh": _mesh_dims(self.strategy),
            "models": len(self._models),
            "optimizers": len(self._optimizers),
            "schedulers": len(self._schedulers),
            "dataloaders": len(self._dataloaders),
            "custom_objects": len(self._custom_objects),
            "mixed_precision": self.mixed_precision,
            "iteration": self.project_configuration.iteration,
        }

    # -- loading -----------------------------------------------------------------------------
    def _newest_checkpoint(self) -> Path:
        root = self._checkpoint_root()
        complete, incomplete = complete_checkpoints(root)
        if incomplete and self.is_main_process:
            warnings.warn(
                f"load_state: ignoring incomplete checkpoints (a save was interrupted): "
                f"{[p.name for p in incomplete]}",
                stacklevel=3,
            )
        if not complete:
            raise FileNotFoundError(f"load_state(): no complete checkpoint under {root}.")
        return complete[-1]

    def load_state(
        self, input_dir: str | os.PathLike[str] | None = None, **load_kwargs: Any
    ) -> str:
        """Restore what save_state saved; with no path, the newest complete checkpoint.

        `map_location` ("cpu", "on_device" or None) is checked as accelerate checks it; either
        value gives the same result, as the loaded states are copied to where the parameters
        (and the optimizer's states) live, which is where "on_device" reads them to.
        """
        _check_map_location(load_kwargs.pop("map_location", None))
        self.wait_for_checkpoint()
        if input_dir is None:
            if not self.project_configuration.automatic_checkpoint_naming:
                raise ValueError(
                    "load_state() needs input_dir unless ProjectConfiguration("
                    "automatic_checkpoint_naming=True) is used."
                )
            source = self._newest_checkpoint()
        else:
            source = Path(input_dir)
        meta = self._check_checkpoint(source)
        models = list(self._models)
        for hook in self._load_hooks.values():
            hook(models, os.fspath(source))
        strict = load_kwargs.get("strict", True)
        with _naming_differences(source, meta, self.strategy):
            for i, model in enumerate(self._models):
                if any(model is m for m in models):
                    self.strategy.load_model_files(
                        model, source, _name("model", i), read_full=read_weights, strict=strict
                    )
            for i, opt in enumerate(self._optimizers):
                self.strategy.load_optimizer_files(
                    opt.optimizer, source, _name("optimizer", i),
                    model=self._model_of(opt.optimizer),
                )  # fmt: skip
        for i, sched in enumerate(self._schedulers):
            sched.load_state_dict(_load(source / f"{_name('scheduler', i)}.bin"))
        if (source / "scaler.pt").exists():
            self.precision.load_state_dict(_load(source / "scaler.pt"))
        for i, obj in enumerate(self._custom_objects):
            obj.load_state_dict(_load(source / f"custom_checkpoint_{i}.pkl", trusted=True))
        self._load_process_state(source, meta)
        match = CHECKPOINT_RE.match(source.name)
        if self.project_configuration.automatic_checkpoint_naming and match:
            self.project_configuration.iteration = int(match.group(1)) + 1
        return os.fspath(source)

    def load_state_if_any(self, **load_kwargs: Any) -> str | None:
        """Resume from the newest complete checkpoint when there is one; else start fresh.

        One line at the top of a loop that torchrun may restart (``accel launch
        --max_restarts N``) or a job that is requeued: returns the checkpoint loaded, or
        None. Needs ProjectConfiguration(automatic_checkpoint_naming=True) and a
        project_dir; call it after `prepare` and `register_for_checkpointing`.
        """
        if not self.project_configuration.automatic_checkpoint_naming:
            raise ValueError(
                "load_state_if_any() finds checkpoints by their automatic names: pass "
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
            )
        if not complete_checkpoints(self._checkpoint_root())[0]:
            return None
        return self.load_state(**load_kwargs)

    def _check_checkpoint(self, source: Path) -> dict[str, Any] | None:
        """accel's marker (None for a folder accelerate wrote), after checking that the
        checkpoint is complete and holds what this run prepared."""
        marker = source / MARKER
        if not marker.exists():
            if (source / rng_file(0)).exists():  # written by accelerate: complete when its
                self._check_accelerate_checkpoint(source)  # last file is there
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
            if self.strategy.reshardable
            else self.num_processes,
            "models": len(self._models),
            "optimizers": len(self._optimizers),
            "schedulers": len(self._schedulers),
            "dataloaders": len(self._dataloaders),
            "custom_objects": len(self._custom_objects),
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

    def _check_accelerate_checkpoint(self, source: Path) -> None:
        customs = [f.name for f in source.iterdir() if _CUSTOM_RE.match(f.name)]
        if len(customs) != len(self._custom_objects):
            raise ValueError(
                f"the checkpoint {source} holds {len(customs)} registered objects "
                f"(custom_checkpoint_<i>.pkl), this run registered {len(self._custom_objects)}: "
                f"register the same objects as the run that saved it."
            )
        saved = saved_processes(source, None)
        if not self.strategy.reshardable and saved != self.num_processes:
            raise ValueError(
                f"the checkpoint {source} was saved by {saved} processes, this run has "
                f"{self.num_processes}; under {self.strategy.name} it resumes on as many."
            )

    def _load_process_state(self, source: Path, meta: dict[str, Any] | None) -> None:
        saved_world = saved_processes(source, meta)
        # On another number of processes (see accel._reshard), each process takes the state
        # of the saved process with its index, or the last one, except for the RNG.
        existed = self.process_index < saved_world
        rank = min(self.process_index, saved_world - 1)
        rng = load_rng_file(source / rng_file(rank))
        extras = source / process_file(rank)
        if extras.exists():
            self._load_accel_extras(source, _load(extras), meta, saved_world)
        else:  # accelerate's checkpoint: its step counter, no data position (as accelerate)
            step = int(rng.get("step", 0))
            num_steps = self.gradient_state.num_steps
            self.gradient_state.load_state_dict(
                {"step": step % num_steps, "micro_step": step,
                 "sync_gradients": step % num_steps == 0}
            )  # fmt: skip
        if existed:
            set_rng_state(rng)
        else:
            warnings.warn(
                f"load_state: process {self.process_index} did not exist in the run that saved "
                f"{source} ({saved_world} processes), so it keeps its own random state.",
                stacklevel=3,
            )

    def _load_accel_extras(
        self, source: Path, state: dict[str, Any], meta: dict[str, Any] | None, saved_world: int
    ) -> None:
        """Data positions, accumulation state and accumulated gradients (accel's extras)."""
        saved_dp = int((meta or {}).get("data_parallel_size") or saved_world)
        now_dp = self.strategy.data_parallel_size
        same_world = saved_world == self.num_processes
        notes = []
        sizes = state.get("dataloader_batch_sizes") or [None] * len(state["dataloaders"])
        # Run as accelerate (the switch on), a loader that is not stateful starts its epoch
        # afresh, as accelerate's does: scripts written for it skip the batches they consumed
        # themselves (diffusers' training examples do), and would skip them twice otherwise.
        keep_position = not is_used_as_accelerate() or self.use_stateful_dataloader
        for dl, dl_state, saved_total in zip(self._dataloaders, state["dataloaders"], sizes):
            if saved_dp != now_dp:
                now_total = getattr(dl, "total_batch_size", None)
                try:
                    dl_state, note = continue_data_position(
                        dl_state, saved_total, now_total, now_dp
                    )
                except ValueError as error:
                    msg = f"{source} was saved by {saved_dp} data-parallel ranks: {error}"
                    raise ValueError(msg) from None
                notes += [note] if note else []
            if keep_position:
                dl.load_state_dict(dl_state)
        if notes and self.is_main_process:
            warnings.warn(
                f"load_state: {source} was saved by {saved_dp} data-parallel ranks, this run has "
                f"{now_dp}; the data position is approximate: " + "; ".join(notes),
                stacklevel=4,
            )
        self.gradient_state.load_state_dict(state["gradient_state"])
        for model, grads in zip(self._models, state.get("gradients", [])):
            if not same_world:
                raise ValueError(
                    f"{source} was saved in the middle of gradient accumulation by {saved_world} "
                    f"processes; accumulated gradients resume only on as many processes "
                    f"(this run has {self.num_processes}). Save at an accumulation boundary."
                )
            self.strategy.load_gradients_state(model, grads)

    # -- model export ------------------------------------------------------------------------
    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights for inference, sharded with an index json when large."""
        from accel._export import save_sharded
        from accel_bigmodel import get_state_dict_offloaded_model, has_offloaded_params

        inner = self.unwrap_model(model)
        if any(has_offloaded_params(m) for m in inner.modules()):
            state = get_state_dict_offloaded_model(inner)  # its weights live on cpu / disk
        else:
            state = self.get_state_dict(model)
        if self._writer():
            save_sharded(state, Path(save_directory), max_shard_size, safe_serialization)
        self.wait_for_everyone()


def _check_map_location(map_location: Any) -> None:
    """accelerate's accepted values for `load_state(map_location=...)`, refused as it refuses."""
    if map_location not in [None, "cpu", "on_device"]:
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, "
            f"or `'on_device'` (got {map_location!r})."
        )


def _mesh_dims(strategy: Any) -> dict[str, int] | None:
    """{dimension: size} of the strategy's device mesh (None without one)."""
    mesh = strategy.device_mesh
    names = getattr(mesh, "mesh_dim_names", None)
    if mesh is None or names is None:
        return None
    return {name: int(size) for name, size in zip(names, mesh.mesh.shape)}


@contextlib.contextmanager
def _naming_differences(source: Path, meta: dict[str, Any] | None, strategy: Any) -> Any:
    """Loading weights saved on another mesh: when the placements do not allow it, the error
    names the dimensions that differ (what the user changes to resume)."""
    saved, now = (meta or {}).get("mesh"), _mesh_dims(strategy)
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


def _finalize(
    tmp: Path, target: Path, meta: dict[str, Any], limit: int | None, fsync: bool
) -> None:
    """On the writing process, once every file is written: the completion marker, then the
    rename into place (replacing an older folder of that name), then the total_limit."""
    with deferred_fsync(enabled=fsync):
        marker = tmp / MARKER
        meta = {**meta, "files": sorted(p.name for p in tmp.iterdir())}
        marker.write_text(json.dumps(meta, indent=1))
        fsync_file(marker)
        fsync_dir(tmp)
    trash = tmp.parent / f".{target.name}.old"
    if target.exists():
        target.rename(trash)
    tmp.rename(target)
    fsync_dir(target.parent)
    if trash.exists():
        shutil.rmtree(trash)
    if tmp.parent.name == STAGING:  # leave the project folder as accelerate's: checkpoints/
        with contextlib.suppress(OSError):  # not empty: another save is being written
            tmp.parent.rmdir()
    if limit is not None:
        complete, _ = complete_checkpoints(target.parent)
        for old in complete[: max(len(complete) - limit, 0)]:
            shutil.rmtree(old)


class _AsyncSave:
    """The background half of an asynchronous save_state on one process.

    Each process runs its staged writes, then leaves a `.written_<rank>` file in the folder;
    the writing process waits for every one of them (no collective: training goes on in the
    main thread) and then finalizes. Nothing is marked complete before every file is written,
    so a process killed meanwhile leaves the previous checkpoint the newest complete one.
    """

    WAIT_FOR_PEERS_S = 3600.0

    def __init__(
        self, jobs: list, tmp: Path, target: Path, meta: dict[str, Any], limit: int | None,
        *, writer: bool, rank: int, world: int, fsync: bool,
    ) -> None:  # fmt: skip
        self.target = target
        self.error: BaseException | None = None
        args = (jobs, tmp, target, meta, limit, writer, rank, world, fsync)
        self.thread = threading.Thread(target=self._run, args=args, name="accel-async-save")
        self.thread.start()

    def _run(
        self, jobs: list, tmp: Path, target: Path, meta: dict[str, Any], limit: int | None,
        writer: bool, rank: int, world: int, fsync: bool,
    ) -> None:  # fmt: skip
        try:
            with deferred_fsync(enabled=fsync):
                run_parallel(jobs)
            (tmp / f".written_{rank}").write_text("")
            if not writer:
                return
            deadline = time.monotonic() + self.WAIT_FOR_PEERS_S
            flags = [tmp / f".written_{r}" for r in range(world)]
            while not all(f.exists() for f in flags):
                if time.monotonic() > deadline:
                    missing = [f.name for f in flags if not f.exists()]
                    raise TimeoutError(f"processes never finished writing: {missing}")
                time.sleep(0.02)
            for flag in flags:
                flag.unlink()
            _finalize(tmp, target, meta, limit, fsync)
        except BaseException as err:  # reported by wait_for_checkpoint
            self.error = err

    def join(self) -> None:
        self.thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(
                f"the asynchronous save_state into {self.target} failed ({self.error!r}); the "
                f"previous checkpoint is still the newest complete one."
            ) from self.error
