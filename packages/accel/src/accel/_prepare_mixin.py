"""`Accelerator.prepare` and its parts, as a mixin of the Accelerator: models are converted for
the precision and handed with their optimizers to the strategy, which wraps or shards them;
optimizers, schedulers and dataloaders get their wrappers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel._data_loader import DataLoaderDispatcher, DataLoaderShard, iteration_observer
from accel._dynamo import compile_model
from accel._memory_check import check_at_prepare
from accel._quantized import check_quantized_placement
from accel._wrappers import AcceleratedOptimizer, AcceleratedScheduler
from accel_data import prepare_data_loader


class PrepareMixin:
    """prepare / prepare_model / prepare_optimizer / prepare_scheduler / prepare_data_loader."""

    _step_metrics: Any = None  # the StepMetrics (accel._step_metrics) when on
    memory_check: Any = None  # "80GiB" / "auto": warn at prepare (accel._memory_check)

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and dataloaders, in any order and number.

        Returns them in the same order (a single object when one was passed). Objects of
        other types are returned untouched.
        """
        placement = device_placement or [self.device_placement] * len(args)
        if len(placement) != len(args):
            raise ValueError(
                f"device_placement has {len(placement)} entries for {len(args)} objects."
            )
        result = list(args)
        models = [i for i, a in enumerate(args) if isinstance(a, nn.Module)]
        optims = [i for i, a in enumerate(args) if isinstance(a, torch.optim.Optimizer)]
        raw_optims = [getattr(args[i], "optimizer", args[i]) for i in optims]
        steps = self.strategy.accumulation_steps(self.gradient_accumulation_steps)
        if steps != self.gradient_accumulation_steps:  # an engine config fixes its own
            self.gradient_accumulation_steps = steps
        self.strategy.begin_prepare(
            args,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            split_batches=self.split_batches,
            sync_gradients=lambda: self.gradient_state.sync_gradients,
        )
        check_at_prepare(self, [args[i] for i in models], raw_optims, args)  # opt-in
        prepared = self._prepare_models(
            [args[i] for i in models], raw_optims, [placement[i] for i in models]
        )
        for i, model in zip(models, prepared):
            result[i] = model
        for i in optims:
            swap = self._replaced_optimizers.get(id(getattr(args[i], "optimizer", args[i])))
            result[i] = self._prepare_optimizer(args[i] if swap is None else swap[1])
        for i, obj in enumerate(args):
            if _is_scheduler(obj):
                result[i] = self._prepare_scheduler(obj)
            elif isinstance(obj, torch.utils.data.DataLoader):
                result[i] = self._prepare_dataloader(obj, placement[i])
                if models:  # read by the model of this call (DeepSpeed's sequence parallel)
                    result[i] = self.strategy.sequence_loader(result[i])
        _mark_prepared(
            result, (self._models, self._optimizers, self._schedulers, self._dataloaders)
        )
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> nn.Module:
        placement = self.device_placement if device_placement is None else device_placement
        check_quantized_placement(model, self.device, self.num_processes > 1)
        if evaluation_mode:
            model = self.precision.wrap_forward(self.precision.convert_module(model))
            model = model.to(self.device) if placement else model
            return compile_model(model, self.dynamo_plugin, model)
        return self._prepare_models([model], [], [placement])[0]

    def _prepare_models(
        self, models: list[nn.Module], optimizers: list[Any], placements: list[bool]
    ) -> list[nn.Module]:
        """Convert each new model for the precision, then hand the models of this call with
        their optimizers to the strategy, which wraps or shards them (and may re-point the
        optimizers at new parameters); compile last when asked."""
        out = list(models)
        todo, kept, known = [], [], set()
        for i, model in enumerate(models):
            if any(model is m or self.unwrap_model(m) is model for m in self._models):
                known.add(i)  # prepared before: returned as it is
                continue
            check_quantized_placement(model, self.device, self.num_processes > 1)
            spread = devices_of_dispatched(model)
            if spread and (self.num_processes > 1 or self.strategy.sharded):
                raise ValueError(
                    f"This model was dispatched over several devices ({spread}); strategy "
                    f"{self.strategy.name!r} on {self.num_processes} process(es) needs each "
                    "process to hold a whole copy or a shard. Load it on one device per process "
                    "(device_map={'': accelerator.local_process_index}) or shard it with FSDP."
                )
            model = self.precision.convert_module(model, *optimizers)
            out[i] = self.precision.wrap_forward(model)
            if spread:
                continue  # one process: it keeps its placement (naive model parallelism)
            if placements[i] or self.strategy.sharded:
                todo.append(i)
            elif self.num_processes > 1:
                kept.append(i)  # wrapped for DDP where it is (device_placement=False)
        if todo:
            wrapped, new = self.strategy.prepare([out[i] for i in todo], optimizers)
            self._note_replaced(optimizers, new)
            for i, model in zip(todo, wrapped):
                out[i] = model
        if kept:
            with self.strategy.keeping_placement():
                wrapped, new = self.strategy.prepare([out[i] for i in kept], optimizers)
            self._note_replaced(optimizers, new)
            for i, model in zip(kept, wrapped):
                out[i] = model
        for i, model in enumerate(out):
            if i in known:
                continue
            out[i] = compile_model(model, self.dynamo_plugin, self.strategy.unwrap_model(model))
            self._models.append(out[i])
            if self._step_metrics is not None:
                self._step_metrics.watch_model(out[i])
        return out

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        wrapped = AcceleratedOptimizer(
            optimizer, self.precision, self.gradient_state, self.strategy
        )
        self._optimizers.append(wrapped)
        if self._step_metrics is not None:
            self._step_metrics.watch_optimizer(wrapped)
        return wrapped

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        return self._prepare_optimizer(optimizer)

    def _note_replaced(self, optimizers: list[Any], new: list[Any]) -> None:
        """Remember the optimizers a strategy replaced (an engine's own optimizer), so that
        prepare returns the replacement and schedulers made for the original follow it."""
        for old, replacement in zip(optimizers, new):
            if replacement is not old:
                self._replaced_optimizers[id(old)] = (old, replacement)

    def _prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        swap = self._replaced_optimizers.get(id(getattr(scheduler, "optimizer", None)))
        if swap is not None:
            scheduler.optimizer = swap[1]
        inner = getattr(scheduler, "optimizer", None)
        optimizers = [o for o in self._optimizers if o.optimizer is inner or o is inner]
        if inner is not None and not optimizers:
            raise ValueError(
                "prepare() got a scheduler whose optimizer was not prepared; pass the optimizer "
                "to prepare() too (before or together with its scheduler)."
            )
        if isinstance(inner, AcceleratedOptimizer):
            scheduler.optimizer = inner.optimizer
        owned = self.strategy.engine_scheduler(scheduler)  # the engine steps it itself
        wrapped = AcceleratedScheduler(
            scheduler if owned is None else owned,
            optimizers,
            self.gradient_state,
            stepped_by_engine=owned is not None,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            num_processes=self.strategy.data_parallel_size,  # one step per data-parallel replica
        )
        self._schedulers.append(wrapped)
        return wrapped

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        return self._prepare_scheduler(scheduler)

    def _prepare_dataloader(self, dataloader: Any, placement: bool) -> Any:
        # Processes of one tensor/context-parallel group read the same batches.
        if self.dispatch_batches and self.strategy.data_parallel_size != self.num_processes:
            raise ValueError(
                f"dispatch_batches=True sends one batch slice to each of the {self.num_processes} "
                f"processes, but this device mesh has {self.strategy.data_parallel_size} "
                f"data-parallel ranks; use dispatch_batches=False (each data-parallel rank reads "
                f"its own batches)."
            )
        feeder = self.strategy.batch_feeder() if placement else None  # XLA's parallel loader
        prepared = prepare_data_loader(
            dataloader,
            num_processes=self.strategy.data_parallel_size,
            process_index=self.strategy.data_parallel_rank,
            device=self.device,
            put_on_device=placement and feeder is None,
            iteration_observer=self._iteration_observer(),
            shard_class=DataLoaderShard,
            dispatcher_class=DataLoaderDispatcher,
            **self.dataloader_config.prepare_kwargs(),
        )
        prepared.gradient_state = self.gradient_state
        prepared.batch_feeder = feeder
        self._dataloaders.append(prepared)
        if self._step_metrics is not None:
            self._step_metrics.watch_loader(prepared)
        return prepared

    def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        return self._prepare_dataloader(data_loader, placement)

    def _iteration_observer(self) -> Any:
        """What a prepared loader tells when an iteration starts and ends (see _data_loader)."""
        return iteration_observer(self.gradient_state, self.rng_types)


def devices_of_dispatched(model: nn.Module) -> list[str]:
    """The devices of a model dispatched over several (its `hf_device_map`), else []."""
    for module in model.modules():
        device_map = getattr(module, "hf_device_map", None)
        if isinstance(device_map, dict):
            devices = sorted({str(d) for d in device_map.values()})
            return devices if len(devices) > 1 else []
    return []


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    )


def _mark_prepared(objects: list[Any], kept: tuple[list[Any], ...]) -> None:
    """`_is_accelerate_prepared = True` on what prepare returned and now tracks (the flag
    libraries read to skip preparing twice); other objects pass through unmarked."""
    tracked = {id(o) for group in kept for o in group}
    for obj in objects:
        if id(obj) in tracked:
            try:
                obj._is_accelerate_prepared = True
            except AttributeError:  # an object that takes no attributes stays unmarked
                pass
