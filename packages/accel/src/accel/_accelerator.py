"""`Accelerator`: one training loop on CPU, one GPU, or many processes.

It composes the packages: accel-state (who am I), accel-precision (one precision object),
accel-parallel (one strategy), accel-data (sharded, resumable loaders), accel-tracking.
Both backend objects are chosen once, in the constructor; afterwards every method calls
them and never branches on the backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from accel import _accelerator_config as _config_of
from accel._accelerator_state import AcceleratorState
from accel._checkpoint import Checkpointer
from accel._collectives_mixin import CollectivesMixin
from accel._config import (
    ProfileKwargs,
    ProjectConfiguration,
    sort_kwargs_handlers,
)
from accel._diagnostics import start_hang_doctor, start_oom_snapshot
from accel._dynamo import TorchDynamoPlugin, resolve_dynamo_plugin
from accel._gradient_state import GradientAccumulationPlugin, GradientState
from accel._io import save_one
from accel._mesh_mixin import MeshMixin
from accel._prepare_mixin import PrepareMixin, devices_of_dispatched
from accel._stopping import StoppingMixin
from accel._tracking_mixin import TrackingMixin
from accel._wrappers import AcceleratedOptimizer, AcceleratedScheduler, plain_backward
from accel_data import DataLoaderConfiguration, skip_first_batches
from accel_state import DistributedType, ProcessControl, device_entry, resolved_launch_config

# accel-parallel's and accel-precision's names are imported where they are used: which engine
# and precision a run takes is decided when an Accelerator is made, and importing every engine
# with `from accel import Accelerator` would cost what a run that never uses them should not pay.
if TYPE_CHECKING:
    from accel_parallel import Strategy, TorchTensorParallelPlugin

_NULL_CONTEXT = contextlib.nullcontext()
# Where torch's Join applies: DDP over processes (of any device kind; an assigned
# `state.distributed_type` of another engine turns it off, as in accelerate).
_DATA_PARALLEL_TYPES = frozenset(t for t in DistributedType if t.name.startswith("MULTI_"))


class Accelerator(
    ProcessControl, PrepareMixin, CollectivesMixin, TrackingMixin, StoppingMixin, MeshMixin
):
    """Runs an ordinary PyTorch training loop unchanged on one or many processes."""

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        *,
        even_batches: bool | None = None,
        dispatch_batches: bool | None = None,
        use_seedable_sampler: bool | None = None,
        strategy: str | Strategy | None = None,
        log_step_metrics: bool | None = None,
        hang_timeout: float | None = None,
        oom_memory_snapshot: bool = False,
        fault_tolerance: Any = None,
    ) -> None:
        """accelerate's arguments, plus `strategy`: a registered strategy's name ("ddp",
        "fsdp", "deepspeed", "mesh", "pipeline", "single_device", "xla", "xla_spmd",
        "fault_tolerant", or one registered with accel_parallel.register_strategy) or a ready
        Strategy, beside the familiar plugins
        (which configure the named strategy); `log_step_metrics`: per optimizer step
        throughput, FLOPs, MFU, memory and data wait (`step_metrics`, trackers, a line);
        `hang_timeout`: seconds after which a step or collective is diagnosed as a hang
        (accel_state.hang); `oom_memory_snapshot`: on CUDA, a snapshot of the allocator's
        history written when a step runs out of memory; `fault_tolerance`: a
        FaultTolerancePlugin, this run is one of several replica groups that survive each
        other's failures (torchft)."""
        from accel_parallel import ProcessInfo, resolve_strategy
        from accel_precision import FP8RecipeKwargs, make_precision

        handlers = sort_kwargs_handlers(kwargs_handlers)
        self.state = AcceleratorState(
            cpu=cpu,
            init_process_group_kwargs=handlers.get("init_process_group"),
            **_xla_placement(cpu, strategy),
        )
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = _config_of.rng_types(rng_types)
        self.dataloader_config = _config_of.dataloader_config(
            dataloader_config, split_batches, even_batches, dispatch_batches, use_seedable_sampler
        )
        project = project_config or ProjectConfiguration()  # held by the Checkpointer
        if project_dir is not None:
            project.set_directories(project_dir)

        mode = str(_config_of.from_launch("mixed_precision", mixed_precision, "no"))
        launched = resolved_launch_config()
        fp8_kwargs = handlers.get("fp8")
        if fp8_kwargs is None and mode == "fp8" and launched.get("fp8_config"):
            fp8_kwargs = FP8RecipeKwargs.from_config(launched["fp8_config"])  # accel launch --fp8_*
        info = ProcessInfo(
            device=self.device,
            num_processes=self.num_processes,
            process_index=self.process_index,
            local_process_index=self.local_process_index,
        )
        # One place decides the engine, from every source (accel-parallel's resolver); the
        # precision object is then made for it (a sharded engine needs a sharded scaler).
        engine = resolve_strategy(
            info,
            strategy=strategy,
            ddp_kwargs=handlers.get("ddp"),
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugin=_config_of.one_of(
                deepspeed_plugin, deepspeed_plugins, "deepspeed_plugin"
            ),
            torch_tp_plugin=torch_tp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            parallelism_config=parallelism_config,
            launch_config=launched,
            environ=os.environ,
            mixed_precision=mode,
            fault_tolerance=fault_tolerance,
        )
        self.strategy, self.parallelism_config = engine.strategy, engine.parallelism_config
        if self.strategy.engine_precision is not None:
            mode = "no"  # the engine casts the model and scales the loss itself
        self.precision = make_precision(
            mode,
            device_type=self.device.type,
            autocast_kwargs=handlers.get("autocast"),
            scaler_kwargs=handlers.get("scaler"),
            fp8_kwargs=fp8_kwargs,
            sharded=self.strategy.sharded,
        )
        self.strategy.attach_precision(self.precision)
        self._plain_backward = plain_backward(self.strategy, self.precision)
        self.dynamo_plugin = resolve_dynamo_plugin(
            dynamo_backend, dynamo_plugin, launched.get("dynamo_config") or {}
        )
        if gradient_accumulation_steps is None and gradient_accumulation_plugin is None:
            gradient_accumulation_steps = self.strategy.default_accumulation_steps()
        self.gradient_state = GradientState(
            _config_of.accumulation_plugin(
                gradient_accumulation_plugin, gradient_accumulation_steps
            )
        )
        self.profile_handler: ProfileKwargs | None = handlers.get("profile")
        # The familiar handler attributes: what kwargs_handlers gave for each kind (or None).
        self.ddp_handler = handlers.get("ddp")
        self.scaler_handler = handlers.get("scaler")
        self.init_handler = handlers.get("init_process_group")
        self.autocast_handler = handlers.get("autocast")
        self.fp8_recipe_handler = handlers.get("fp8")
        AcceleratorState._record(
            mixed_precision=self.mixed_precision,
            deepspeed_plugins=self.strategy.engine_plugins(),
            strategy=self.strategy,
        )
        self._models: list[nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[Any] = []
        self._replaced_optimizers: dict[int, tuple[Any, Any]] = {}
        self._trigger = False
        self._checkpointer = Checkpointer(
            state=self.state, strategy=self.strategy, precision=self.precision,
            gradient_state=self.gradient_state, project_configuration=project,
            models=self._models, optimizers=self._optimizers, schedulers=self._schedulers,
            dataloaders=self._dataloaders,
        )  # fmt: skip
        self._init_tracking(log_with)
        self._step_metrics = _config_of.step_metrics_for(
            self, log_step_metrics, handlers.get("step_metrics")
        )
        where = dict(rank=self.process_index, project_dir=self.project_dir)
        self._hang_doctor = start_hang_doctor(hang_timeout, world_size=self.num_processes, **where)
        self._oom_snapshot = start_oom_snapshot(oom_memory_snapshot, device=self.device, **where)

    # -- the familiar properties ------------------------------------------------------------
    device = property(lambda self: self.state.device)
    distributed_type = property(lambda self: self.state.distributed_type)
    num_processes = property(lambda self: self.state.num_processes)
    process_index = property(lambda self: self.state.process_index)
    local_process_index = property(lambda self: self.state.local_process_index)
    is_main_process = property(lambda self: self.state.is_main_process)
    is_local_main_process = property(lambda self: self.state.is_local_main_process)
    is_last_process = property(lambda self: self.state.is_last_process)
    use_distributed = property(lambda self: self.state.use_distributed)
    mixed_precision = property(lambda self: self.strategy.engine_precision or self.precision.name)
    deepspeed_plugin = property(lambda self: self.state.deepspeed_plugin)
    deepspeed_config = property(
        lambda self: (
            None if self.deepspeed_plugin is None else self.deepspeed_plugin.deepspeed_config
        )
    )
    is_fsdp2 = property(lambda self: self.strategy.fsdp_plugin is not None)
    scaler = property(lambda self: self.precision.scaler)  # the fp16 GradScaler, else None
    native_amp = property(lambda self: self.precision.name in ("fp16", "bf16"))
    use_stateful_dataloader = property(lambda self: self.dataloader_config.use_stateful_dataloader)
    save_iteration = property(lambda self: self.project_configuration.iteration)
    sync_gradients = property(
        lambda self: self.gradient_state.sync_gradients,
        lambda self, value: self.gradient_state._set_sync_gradients(value),
        doc="Whether the next optimizer step applies (the end of an accumulation cycle).",
    )
    split_batches = property(lambda self: self.dataloader_config.split_batches)
    even_batches = property(lambda self: self.dataloader_config.even_batches)
    dispatch_batches = property(lambda self: self.dataloader_config.dispatch_batches)
    non_blocking = property(lambda self: self.dataloader_config.non_blocking)
    use_seedable_sampler = property(lambda self: self.dataloader_config.use_seedable_sampler)
    project_dir = property(lambda self: self.project_configuration.project_dir)
    logging_dir = property(lambda self: self.project_configuration.logging_dir)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin = dataclasses.replace(
            self.gradient_state.plugin, num_steps=steps
        )

    @property
    def step(self) -> int:
        """Micro-batches since the start or the last end of a dataloader (under `accumulate`)."""
        return self.gradient_state.micro_step

    @step.setter
    def step(self, value: int) -> None:
        self.gradient_state.micro_step = int(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def step_metrics(self) -> dict[str, Any]:
        """The last completed optimizer step's figures (see accel._step_metrics.METRIC_KEYS;
        None where unknown); {} when step metrics are off or before the first step."""
        return {} if self._step_metrics is None else dict(self._step_metrics.metrics)

    def count_step_tokens(self, tokens: int | None = None, samples: int | None = None) -> None:
        """Add tokens (and samples) to the current optimizer step's count, for batches that
        have no `input_ids` / `attention_mask`; what is given replaces the count read from
        the batches for this step. Does nothing when step metrics are off."""
        if self._step_metrics is not None:
            self._step_metrics.count(tokens, samples)

    # -- the step -----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward()`, divided by the accumulation steps and scaled for fp16.

        `scale_wrt_gas=False` (the keyword accelerate's DeepSpeed path takes, and transformers'
        Trainer passes after dividing the loss itself) leaves the loss undivided."""
        scale = kwargs.pop("scale_wrt_gas", True) if kwargs else True
        steps = self.gradient_state.plugin.num_steps  # gradient_accumulation_steps, read once
        if scale and steps > 1:
            loss = loss / steps
        if self._plain_backward:  # what the strategy's and the precision's come down to
            loss.backward(**kwargs) if kwargs else loss.backward()
        else:
            self.strategy.backward(loss, self.precision.backward, **kwargs)
        if self._step_metrics is not None:
            self._step_metrics.backward_done()
        if self._hang_doctor is not None:
            self._hang_doctor.beat()

    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[None]:
        """One micro-batch: gradients sync (and the optimizer steps) every N micro-batches and
        on the last batch of the dataloader; in between, `no_sync` skips the all-reduce.

        Called once per micro-batch, so it decides in place (no call into the gradient state
        unless a dataloader is being iterated) and returns no generator-based context manager
        (tools/bench/bench_step_overhead.py counts its calls)."""
        state = self.gradient_state
        plugin = state.plugin
        if state._active_refs and plugin.sync_with_dataloader and state.end_of_dataloader:
            state.step = state.micro_step = 0
            state.sync_gradients = sync = True
        else:
            step = state.step + 1
            state.micro_step += 1
            state.sync_gradients = sync = step % plugin.num_steps == 0
            state.step = 0 if sync else step
        if sync or not models or plugin.sync_each_batch or not self.strategy.supports_no_sync:
            return _NULL_CONTEXT
        from accel_parallel import no_sync_all

        return no_sync_all(self.strategy, models)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        with self.strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Train on inputs of different lengths per process without hanging (DDP).

        Inside the block, `torch.distributed.algorithms.Join` lets a process that ran out of
        batches shadow the collectives of the others. `even_batches` overrides the prepared
        DataLoaders' setting for the block (False: each process keeps its own, shorter share,
        as accelerate does); the loaders get their own setting back afterwards.
        """
        from accel_parallel import JoinsUnevenInputs

        joins = isinstance(self.strategy, JoinsUnevenInputs) and self.num_processes > 1
        if not joins or self.distributed_type not in _DATA_PARALLEL_TYPES:
            if self.distributed_type != DistributedType.NO:  # accelerate's warning
                warnings.warn(
                    "Joining uneven inputs is only supported for multi-GPU training, as a result "
                    "`join_uneven_inputs` will have no effect.",
                    stacklevel=3,
                )
            yield
            return
        restore: list[tuple[Any, bool]] = []
        if even_batches is None:
            even_batches = self.even_batches
        else:
            for loader in self._dataloaders:
                owner = getattr(loader, "batch_sampler", None)
                if not hasattr(owner, "even_batches"):
                    owner = loader if hasattr(loader, "even_batches") else None
                if owner is None or isinstance(loader.dataset, torch.utils.data.IterableDataset):
                    warnings.warn(
                        "join_uneven_inputs(even_batches=...) is only supported for map-style "
                        "datasets; a DataLoader over an iterable dataset keeps its own setting.",
                        stacklevel=3,
                    )
                    continue
                restore.append((owner, owner.even_batches))
                owner.even_batches = even_batches
        try:
            with self.strategy.join(joinables, enable=not even_batches):
                yield
        finally:
            for owner, value in restore:
                owner.even_batches = value

    def trigger_sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Force a gradient sync for the backward in this block (inside a no_sync region)."""
        return self.strategy.sync_in_backward(model)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        targets = self._optimizers if optimizer is None else [optimizer]
        for opt in targets:
            if isinstance(opt, AcceleratedOptimizer):
                opt.unscale_gradients()

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Clip the gradient norm (fp16 gradients are unscaled first). On micro-steps that do
        not sync, gradients are still accumulating: nothing is done and None is returned."""
        if not self.sync_gradients:
            return None
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        if not self.sync_gradients:
            return
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """The precision's autocast; an `AutocastKwargs` given here applies to this block only
        (in place of the one from `kwargs_handlers`)."""
        if autocast_handler is None or not hasattr(self.precision, "autocast_kwargs"):
            return self.precision.autocast()
        return _autocast_with(self.precision, autocast_handler)

    # -- models -------------------------------------------------------------------------------
    def verify_device_map(self, model: nn.Module) -> bool:
        """True when `model` was dispatched over several devices (its `hf_device_map`)."""
        return bool(devices_of_dispatched(model))

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        inner = self.strategy.unwrap_model(model)
        if keep_torch_compile and hasattr(model, "_orig_mod"):
            # The compiled module, as asked. Compiled over a wrapper (DDP): the user's module
            # under a compiled wrapper of its own, as accelerate returns it; the training model
            # keeps its wrapper (accelerate re-points it, so it no longer syncs gradients).
            stripped = model._orig_mod is not inner
            inner = type(model)(inner, model.dynamo_ctx) if stripped else model
        if not keep_fp32_wrapper:
            inner = self.precision.unwrap_forward(inner)
        return inner

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        if unwrap:
            return self.strategy.model_state_dict(model)
        return model.state_dict()

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save `obj` on the main process (safetensors for a dict of tensors when asked);
        `f` may be a store URL (s3://...)."""
        if self.is_main_process:
            save_one(obj, f, safe_serialization)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        return skip_first_batches(dataloader, num_batches)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop the references the Accelerator holds and empty the device cache."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.wait_for_checkpoint()
        self._staging_buffers.clear()  # an asynchronous save's CPU copies
        gc.collect()
        _empty_cache(self.device)
        return [None] * len(objects)

    clear = free_memory

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """torch.profiler around the block; a Chrome trace per process when a directory is set."""
        from accel._profile import make_profiler

        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with make_profiler(handler, self.device) as prof:
            yield prof
        if handler.output_trace_dir:
            os.makedirs(handler.output_trace_dir, exist_ok=True)
            path = os.path.join(handler.output_trace_dir, f"trace_rank{self.process_index}.json")
            prof.export_chrome_trace(path)

    # -- checkpoints: the Checkpointer (accel._checkpoint) does the work -----------------------
    project_configuration = property(
        lambda self: self._checkpointer.project_configuration,
        lambda self, value: setattr(self._checkpointer, "project_configuration", value),
        doc="The ProjectConfiguration: folders, automatic checkpoint naming, its iteration.",
    )
    # an asynchronous save in flight and its CPU buffers (end_training and free_memory use them)
    _pending_save = property(
        lambda self: self._checkpointer.pending,
        lambda self, value: setattr(self._checkpointer, "pending", value),
    )
    _staging_buffers = property(lambda self: self._checkpointer.staging_buffers)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (anything with state_dict / load_state_dict)."""
        from accel_parallel.fault_tolerance import ReplicaGroups

        self._checkpointer.register(*objects)
        if isinstance(self.strategy, ReplicaGroups):  # a rejoining group heals them too
            self.strategy.register_for_healing(*objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` before the models are saved; removing a
        model's entry from `weights` skips writing it (the hook saves it its own way)."""
        return self._checkpointer.add_save_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` before the models are loaded; removing a model from
        `models` skips loading it."""
        return self._checkpointer.add_load_hook(hook)

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
        return self._checkpointer.save(output_dir, safe_serialization, async_save)

    def wait_for_checkpoint(self) -> None:
        """Wait until an asynchronous `save_state` is written and marked complete (on every
        process); raise its error if it failed. Does nothing when none is in flight."""
        self._checkpointer.wait()

    def load_state(
        self, input_dir: str | os.PathLike[str] | None = None, **load_kwargs: Any
    ) -> str:
        """Restore what save_state saved; with no path, the newest complete checkpoint.

        `map_location` ("cpu", "on_device" or None) is checked as accelerate checks it; either
        value gives the same result, as the loaded states are copied to where the parameters
        (and the optimizer's states) live, which is where "on_device" reads them to.
        """
        stateful = self.use_stateful_dataloader
        return self._checkpointer.load(input_dir, stateful_loaders=stateful, **load_kwargs)

    def load_state_if_any(self, **load_kwargs: Any) -> str | None:
        """Resume from the newest complete checkpoint when there is one; else start fresh.

        One line at the top of a loop that torchrun may restart (``accel launch
        --max_restarts N``) or a job that is requeued: returns the checkpoint loaded, or
        None. Needs ProjectConfiguration(automatic_checkpoint_naming=True) and a
        project_dir; call it after `prepare` and `register_for_checkpointing`.
        """
        stateful = self.use_stateful_dataloader
        return self._checkpointer.load_if_any(stateful_loaders=stateful, **load_kwargs)

    def save_model(
        self,
        model: nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights for inference, sharded with an index json when large."""
        unwrapped = self.unwrap_model(model)
        self._checkpointer.save_model(
            model, unwrapped, save_directory, max_shard_size, safe_serialization
        )

    def __repr__(self) -> str:
        return f"Accelerator(strategy={self.strategy.name}, mixed_precision={self.mixed_precision!r}, state={self.state!r})"


@contextlib.contextmanager
def _autocast_with(precision: Any, handler: Any) -> Iterator[Any]:
    """The precision's autocast with `handler` in place of its AutocastKwargs for the block."""
    saved = precision.autocast_kwargs
    precision.autocast_kwargs = handler
    try:
        with precision.autocast() as ctx:
            yield ctx
    finally:
        precision.autocast_kwargs = saved


def _xla_placement(cpu: bool | None, strategy: Any) -> dict[str, Any]:
    """Where the run's engine places this process, when its runtime rather than accel-state
    decides (torch-xla's, for the XLA strategies, named or found by an XLA device), asked of
    the strategy (`accel_parallel.process_placement`); nothing with cpu=True. Where the
    engine runs this process's replicas as threads, it splits the state per thread first."""
    if cpu:
        return {}
    from accel_parallel import process_placement

    placed = process_placement(strategy, os.environ)
    if placed is None:
        return {}
    return {
        "device": placed.device,
        "num_processes": placed.num_processes,
        "process_index": placed.process_index,
        "local_process_index": placed.local_process_index,
    }


def _empty_cache(device: torch.device) -> None:
    device_entry(device).empty_cache()  # a no-op on the host and on XLA, which frees its own
