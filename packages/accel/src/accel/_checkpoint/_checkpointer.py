"""The Checkpointer: save_state / load_state with exact resume and atomic folders, and
save_model's export. The Accelerator holds one and delegates its familiar methods to it.

A checkpoint is a folder in accelerate's layout (`accel_parallel.checkpoint` names every
file), so that either library resumes the other's. It is written in a hidden temporary folder,
every file fsynced, then completed by a marker file (``accel_checkpoint.json``, written last)
and renamed into place. A crash at any moment leaves either the previous checkpoints untouched
or a temporary folder that `load()` ignores, saying so (and that accelerate never sees).

What is saved: each model's weights and each optimizer's state (through the strategy), each
scheduler, the precision scaler, registered objects; and per process: every RNG (python,
numpy, torch, accelerator), each prepared dataloader's position, the gradient accumulation
micro-step and, in the middle of an accumulation, the gradients accumulated so far.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from accel._checkpoint import _naming
from accel._checkpoint._commit import AsyncSave
from accel._checkpoint._destination import destination, fetch_checkpoint
from accel._checkpoint._load import (
    check_checkpoint,
    check_map_location,
    load_process_state,
    naming_differences,
)
from accel._checkpoint._write import marker_meta, model_of, replica_groups, write_checkpoint
from accel._io import as_location, is_url, load_file, read_weights
from accel_parallel import StagingBuffers, deferred_fsync, parallel_writes, staged_writes
from accel_parallel.checkpoint import (
    SCALER_NAME,
    custom_file,
    dcp_data_in_store,
    model_name,
    optimizer_name,
    scheduler_file,
)


class Checkpointer:
    """Saves and restores a run's prepared objects (the Accelerator's lists, shared: objects
    prepared later are included) with what the run is made of: the process topology
    (`state`: ranks, main processes, barrier), the strategy, the precision, the gradient
    state and the ProjectConfiguration."""

    def __init__(
        self,
        *,
        state: Any,
        strategy: Any,
        precision: Any,
        gradient_state: Any,
        project_configuration: Any,
        models: list[torch.nn.Module],
        optimizers: list[Any],
        schedulers: list[Any],
        dataloaders: list[Any],
    ) -> None:
        self.state = state
        self.strategy = strategy
        self.precision = precision
        self.gradient_state = gradient_state
        self.project_configuration = project_configuration
        self.models = models
        self.optimizers = optimizers
        self.schedulers = schedulers
        self.dataloaders = dataloaders
        self.custom_objects: list[Any] = []
        self.save_hooks: collections.OrderedDict[int, Callable] = collections.OrderedDict()
        self.load_hooks: collections.OrderedDict[int, Callable] = collections.OrderedDict()
        self.pending: AsyncSave | None = None
        self.last_upload_bytes = 0  # what this process sent to a store at the last save
        # The CPU copies of the last asynchronous save, reused by the next (free_memory drops)
        self.staging_buffers = StagingBuffers()
        if is_url(project_configuration.project_dir) and state.is_local_main_process:
            from accel_bigmodel.stores import check_store  # each host's own way to the store

            check_store(project_configuration.project_dir, write=True)  # now, not at a save

    # -- registration ------------------------------------------------------------------------
    def register(self, *objects: Any) -> None:
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
        self.custom_objects.extend(objects)

    def add_save_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` before the models are saved."""
        handle = RemovableHandle(self.save_hooks)
        self.save_hooks[handle.id] = hook
        return handle

    def add_load_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` before the models are loaded."""
        handle = RemovableHandle(self.load_hooks)
        self.load_hooks[handle.id] = hook
        return handle

    # -- saving ------------------------------------------------------------------------------
    @property
    def writer(self) -> bool:
        """Whether this process writes the files that are not per process."""
        if self.project_configuration.save_on_each_node:
            return self.state.is_local_main_process
        return self.state.is_main_process

    def _sharers(self, target: str) -> list[int]:
        """The ranks saving into the same folder as this process (every rank, unless the
        processes were given folders of their own: a temporary folder each, say)."""
        import accel_state

        if self.state.num_processes == 1:
            return [0]
        targets = accel_state.gather_object([target])
        return [r for r, t in enumerate(targets) if t == target]

    def _owns(self, sharers: list[int]) -> bool:
        """Whether this process creates and completes its folder: the writer, or the first of
        the processes sharing a folder no writer saves into."""
        return self.writer or (self.state.process_index == sharers[0] and 0 not in sharers)

    def model_of(self, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
        """The prepared model whose parameters `optimizer` trains (None if there is none)."""
        return model_of(self.models, optimizer)

    def save(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        async_save: bool | None = None,
    ) -> str:
        """Save everything needed to resume exactly; returns the checkpoint folder (see
        Accelerator.save_state)."""
        self.wait()
        pc = self.project_configuration
        asynchronous = pc.async_save if async_save is None else async_save
        if asynchronous and pc.save_on_each_node:
            raise NotImplementedError(
                "async_save with save_on_each_node is not supported: save synchronously, or "
                "write to a shared folder."
            )
        target = _naming.save_target(pc, output_dir)
        if replica_groups(self.strategy) and not self.strategy.writes_checkpoints:
            if pc.automatic_checkpoint_naming:  # another replica group writes the same folder
                pc.iteration += 1
            return os.fspath(target)
        dest = destination(
            target, pc.automatic_checkpoint_naming, self.last_upload_bytes,
            self.state.local_num_processes,
        )  # fmt: skip
        store = not dest.local  # its steps are agreed: one process's failure fails them all
        handed_over = False  # to an asynchronous save's thread, which cleans up after itself
        try:
            sharers = self._sharers(dest.name)
            owner = self._owns(sharers)
            self._agreed(dest.name, dest.prepare if owner else _nothing, everyone=store)
            self.state.wait_for_everyone()
            meta = marker_meta(self)
            limit = pc.total_limit if pc.automatic_checkpoint_naming else None
            if asynchronous:
                with staged_writes(self.staging_buffers) as jobs:  # copied now, written later
                    write_checkpoint(self, dest.staging, safe_serialization)
                self.pending = AsyncSave(
                    jobs, dest, meta, limit, writer=owner,
                    rank=self.state.process_index, ranks=sharers, fsync=pc.fsync,
                )  # fmt: skip
                handed_over = True
            else:
                self._agreed(dest.name, lambda: self._write(dest, safe_serialization), store)
                self.state.wait_for_everyone()
                complete = lambda: dest.finalize(meta, limit, pc.fsync)  # noqa: E731
                self._agreed(dest.name, complete if owner else _nothing, everyone=store)
                self.state.wait_for_everyone()
                self.last_upload_bytes = dest.uploaded_bytes
        finally:
            if not handed_over:
                dest.cleanup()
        if pc.automatic_checkpoint_naming:
            pc.iteration += 1
        return dest.name

    def _write(self, dest: Any, safe_serialization: bool) -> None:
        """This process's files, written by several threads at once (each flushed in the
        background, into a local destination), then published (uploaded, into a store)."""
        fsync = self.project_configuration.fsync and dest.local
        with deferred_fsync(enabled=fsync), parallel_writes():
            write_checkpoint(self, dest.staging, safe_serialization)
        dest.publish()

    def _agreed(
        self, name: str, step: Callable[[], None], everyone: bool, saving: bool = True
    ) -> None:
        """Run `step`; with `everyone` (a store's upload, on every process), every process
        learns of any process's failure and raises it, instead of waiting for that process
        at the next barrier. A store's errors name the URL and the fix."""
        error: BaseException | None = None
        try:
            step()
        except Exception as err:
            if not everyone:
                raise
            error = err
        if not everyone or self.state.num_processes == 1:
            if error is not None:
                raise error
            return
        import accel_state

        failures = [f for f in accel_state.gather_object([_describe(error)]) if f is not None]
        what = "save_state into" if saving else "load_state from"
        if error is not None:
            raise error
        if failures:
            raise RuntimeError(
                f"{what} {name} failed on another process: {failures[0]}"
                + ("; the previous checkpoint is still the newest complete one." if saving else ".")
            )

    def wait(self) -> None:
        """Wait until an asynchronous save is written and marked complete (on every process);
        raise its error if it failed. Does nothing when none is in flight."""
        pending = self.pending
        if pending is None:
            return
        self.pending = None
        pending.join()
        self.last_upload_bytes = pending.dest.uploaded_bytes
        self.state.wait_for_everyone()
        pending.raise_error()

    # -- loading -----------------------------------------------------------------------------
    def load(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        *,
        stateful_loaders: bool = False,
        **load_kwargs: Any,
    ) -> str:
        """Restore what `save` saved; with no path, the newest complete checkpoint (see
        Accelerator.load_state). `stateful_loaders`: DataLoaderConfiguration's
        use_stateful_dataloader (run as accelerate, loaders keep their position only then)."""
        check_map_location(load_kwargs.pop("map_location", None))
        self.wait()
        pc = self.project_configuration
        if input_dir is None:
            if not pc.automatic_checkpoint_naming:
                raise ValueError(
                    "load_state() needs input_dir unless ProjectConfiguration("
                    "automatic_checkpoint_naming=True) is used."
                )
            source = _naming.newest_checkpoint(pc, self.state.is_main_process, stacklevel=3)
        else:
            source = as_location(input_dir)
        if isinstance(source, str):  # a store: fetched once per host into a local folder
            local = self._fetch(source)
            try:
                with dcp_data_in_store(local, source):
                    self._load_folder(local, stateful_loaders, load_kwargs)
            except (ValueError, FileNotFoundError, RuntimeError) as err:
                if os.fspath(local) not in str(err):
                    raise
                raise type(err)(str(err).replace(os.fspath(local), source)) from err
            finally:
                self.state.wait_for_everyone()  # every process of the host has read it
                if self.state.is_local_main_process or self.state.num_processes == 1:
                    shutil.rmtree(local, ignore_errors=True)
        else:
            self._load_folder(source, stateful_loaders, load_kwargs)
        _naming.continue_numbering(pc, source)
        return os.fspath(source)

    def _fetch(self, url: str) -> Path:
        """The checkpoint at `url` in a local folder: fetched by the first process of each
        host, for all of that host's processes (a folder named by a token of this load, in
        the temp directory); a failure is every process's."""
        if self.state.num_processes == 1:
            return fetch_checkpoint(url, self.state.process_index)
        import uuid

        import accel_state

        token = accel_state.broadcast_object_list([uuid.uuid4().hex])[0]
        local = Path(tempfile.gettempdir()) / f"accel-download-{token}"
        fetch = lambda: fetch_checkpoint(url, None, into=local)  # noqa: E731
        main = self.state.is_local_main_process
        self._agreed(url, fetch if main else _nothing, everyone=True, saving=False)
        return local

    def _load_folder(
        self, source: Path, stateful_loaders: bool, load_kwargs: dict[str, Any]
    ) -> None:
        meta = check_checkpoint(self, source)
        models = list(self.models)
        for hook in self.load_hooks.values():
            hook(models, os.fspath(source))
        strict = load_kwargs.get("strict", True)
        with naming_differences(source, meta, self.strategy):
            for i, model in enumerate(self.models):
                if any(model is m for m in models):
                    self.strategy.load_model_files(
                        model, source, model_name(i), read_full=read_weights, strict=strict
                    )
            for i, opt in enumerate(self.optimizers):
                self.strategy.load_optimizer_files(
                    opt.optimizer, source, optimizer_name(i), model=self.model_of(opt.optimizer)
                )
        for i, sched in enumerate(self.schedulers):
            sched.load_state_dict(load_file(source / scheduler_file(i)))
        if (source / SCALER_NAME).exists():
            self.precision.load_state_dict(load_file(source / SCALER_NAME))
        for i, obj in enumerate(self.custom_objects):
            obj.load_state_dict(load_file(source / custom_file(i), trusted=True))
        load_process_state(self, source, meta, stateful_loaders)
        if replica_groups(self.strategy) and meta and "replica_groups" in meta:
            self.strategy.load_run_state(meta["replica_groups"])

    def load_if_any(self, *, stateful_loaders: bool = False, **load_kwargs: Any) -> str | None:
        """The newest complete automatic checkpoint loaded, or None when there is none."""
        if not self.project_configuration.automatic_checkpoint_naming:
            raise ValueError(
                "load_state_if_any() finds checkpoints by their automatic names: pass "
                "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
            )
        if not _naming.has_checkpoint(self.project_configuration):
            return None
        return self.load(stateful_loaders=stateful_loaders, **load_kwargs)

    # -- model export ------------------------------------------------------------------------
    def save_model(
        self,
        model: torch.nn.Module,
        unwrapped: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write prepared `model`'s weights (`unwrapped` is the user's module in it) for
        inference, sharded with an index json when large (accel-bigmodel's export)."""
        from accel_bigmodel import (  # imported on use: `import accel` stays light
            get_state_dict_offloaded_model,
            has_offloaded_params,
            save_sharded_weights,
        )

        if any(has_offloaded_params(m) for m in unwrapped.modules()):
            state = get_state_dict_offloaded_model(unwrapped)  # its weights live on cpu / disk
        else:
            state = self.strategy.model_state_dict(model)
        if self.writer:  # a store URL: written locally, then uploaded
            from accel_bigmodel.stores import published

            with published(save_directory) as folder:
                save_sharded_weights(state, folder, max_shard_size, safe_serialization)
        self.state.wait_for_everyone()


def _nothing() -> None:
    """What a process that does not own the checkpoint does at the owner's steps."""


def _describe(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"
