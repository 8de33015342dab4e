"""Pipeline parallel on the ``pp`` dimension of a `ParallelismConfig` mesh.

The model is cut into stages (`accel_parallel._pipeline_plan`); each pipeline rank keeps the
weights of its own stages (the others' go to the meta device), applies tensor parallel and
FSDP2 to them as the mesh says, and runs one of `torch.distributed.pipelining`'s schedules.

The familiar loop stays as it is: the schedule runs inside the prepared model's forward
(the batch split into micro-batches, forward and backward of each, the loss averaged over
them, as Megatron-LM does) and returns ``outputs.loss`` on every rank. The gradients it
computed are held back and only land in ``.grad`` when ``accelerator.backward(loss)`` runs,
multiplied by what flows into that backward (the accumulation divisor), so accumulation and
mixed precision behave as without a pipeline. Under fp16 the schedule's loss function is
multiplied by the step's loss scale, so the stages' backward runs on the scaled loss (as a
plain fp16 backward does: small gradients do not underflow, an overflow reaches the scaler). In eval mode (or under
``torch.no_grad``) the schedule runs forward only and the outputs come back on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_parallel import _dtensor
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._mesh import MeshView, OnMeshView, check_mesh_run, mesh_request
from accel_parallel._parallelism_config import ParallelismConfig
from accel_parallel._parallelize import apply_activation_checkpointing, apply_fsdp
from accel_parallel._pipeline_grads import HeldGradients, PipelineOutput, ScaledLoss, held_loss
from accel_parallel._pipeline_hf import (
    TokenLoss,
    is_transformers_decoder,
    padding_keywords,
    pipeline_inputs,
    transformers_loss,
)
from accel_parallel._pipeline_plan import (
    PP_SCHEDULES,
    build_stages,
    full_name,
    stage_to_rank,
    stage_units,
)
from accel_parallel._pipeline_torch import pipeline_stage, step_keywords
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy, prepared_with
from accel_parallel._tp import apply_tensor_parallel
from accel_parallel.checkpoint import _dcp
from accel_parallel.checkpoint._layout import pipeline_folder


class PipelinedModel(nn.Module):
    """The prepared model of a pipeline run: ``module`` is the user's model (this rank's
    stages hold real weights, the others are on the meta device)."""

    def __init__(self, module: nn.Module, strategy: PipelineStrategy, stages: dict) -> None:
        super().__init__()
        self.module = module
        self._strategy = strategy
        self._stages = stages  # stage index -> stage module (this rank's)
        self._schedules: dict[Any, Any] = {}
        self._held: HeldGradients | None = None
        self.config = getattr(module, "config", None)

    def forward(self, *args: Any, **kwargs: Any) -> PipelineOutput:
        return self._strategy.run(self, args, kwargs)


class PipelineStrategy(OnMeshView, Strategy):
    """Pipeline stages over ``pp``, with tensor parallel and FSDP2 inside each stage: the
    stages are cut by the plan (`accel_parallel._pipeline_plan`, or the transformers adapter
    `accel_parallel._pipeline_hf`), and each rank applies `apply_tensor_parallel`,
    activation checkpointing and `apply_fsdp` to its own stages."""

    name = "pipeline"
    supports_no_sync = False
    sharded = True  # every rank must agree on an fp16 overflow
    reshardable = True  # its DCP folders load on any layout

    def __init__(
        self,
        info: ProcessInfo,
        config: ParallelismConfig,
        plugin: FullyShardedDataParallelPlugin | None = None,
        mixed_precision: str = "no",
        *,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(info, clip_norm=clip_norm)
        self.config = config
        self.plugin = plugin or FullyShardedDataParallelPlugin()
        self.mixed_precision = mixed_precision
        self.layout = MeshView(config, info.device)
        self.shards = config.dp_shard_enabled or config.cp_enabled
        self.recompute = self.plugin.activation_checkpointing
        check_mesh_run(config, self.plugin, info.device)
        self._loss_fns: dict[int, ScaledLoss | None] = {}
        self._optimizer_models: dict[int, nn.Module] = {}
        self._writer = _dcp.DCPWriter()

    # -- the mesh (the rest from OnMeshView) ---------------------------------------------------
    def _pp(self) -> Any:
        return self.layout.sub_mesh("pp")

    def _last_rank(self) -> int:
        """The global rank holding the last stage in this process's pipeline."""
        import torch.distributed as dist

        c = self.config
        num = c.pp_size * c.pp_virtual_stages
        last = stage_to_rank(c.pp_schedule, c.pp_size, num)[num - 1]
        return dist.get_global_rank(self._pp().get_group(), last)

    # -- preparing -------------------------------------------------------------------------------
    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if self.info.process_index == 0:
            self.plugin.warn_notices()
        wrapped, trained = _dtensor.repoint_optimizers(models, optimizers, self.wrap_model)
        self._optimizer_models.update(trained)
        for opt in optimizers:  # the other stages' parameters are not this rank's to train
            for group in opt.param_groups:
                group["params"] = [p for p in group["params"] if p.device.type != "meta"]
        return wrapped, optimizers

    def wrap_model(self, model: nn.Module) -> nn.Module:
        if isinstance(model, PipelinedModel):
            return model
        c = self.config
        num = c.pp_size * c.pp_virtual_stages
        stages = build_stages(model, c.pp_plan, num)
        _refuse_ties_across(model, stages)
        loss = c.pp_loss_fn
        if loss is None and is_transformers_decoder(model):
            loss = transformers_loss(model)
        placement = stage_to_rank(c.pp_schedule, c.pp_size, num)
        rank = self._pp().get_local_rank()
        mine = {i: s for i, s in enumerate(stages) if placement[i] == rank}
        if any(p.device.type == "meta" for p in model.parameters()):
            self.move_model(model)  # raises: load the weights first
        for i, stage in enumerate(stages):
            if i not in mine:
                for unit in stage_units(stage):
                    unit.to("meta")  # another rank holds these weights
        if not getattr(self, "_keep_placement", False):
            for stage in mine.values():
                stage.to(self.device)
        if c.tp_enabled:
            self._tensor_parallel(model, mine)
        for stage in mine.values():
            units = [u for u in stage_units(stage) if list(u.parameters())]
            if self.recompute:
                apply_activation_checkpointing(stage, [u for u in units if _is_block(u)] or units)
            if self.shards:
                apply_fsdp(stage, units, self.layout.fsdp_mesh(), self.plugin, self.mixed_precision)
        wrapped = PipelinedModel(model, self, mine)
        self._loss_fns[id(wrapped)] = ScaledLoss(loss) if loss is not None else None
        return wrapped

    def _tensor_parallel(self, model: nn.Module, mine: dict) -> None:
        """Tensor parallel on the modules of this rank's stages."""
        handler = self.config.tp_handler
        sequence = bool(handler and handler.sequence_parallel)
        owned = [name for s in mine.values() for name in s.unit_names.values()]
        for stage in mine.values():  # activations between stages: this rank's slice
            if sequence and hasattr(stage, "seq_shards"):
                stage.seq_shards = self.config.tp_size
        apply_tensor_parallel(
            model,
            self.layout.sub_mesh("tp"),
            self.config.tp_plan,
            sequence_parallel=sequence,
            only=lambda name: any(name == o or name.startswith(f"{o}.") for o in owned),
        )

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        inner = super().unwrap_model(model)
        return inner.module if isinstance(inner, PipelinedModel) else inner

    def _model_for(self, optimizer: torch.optim.Optimizer, model: nn.Module | None) -> nn.Module:
        return prepared_with(self._optimizer_models, optimizer, model, "a pipelined model")

    def optimizer_model(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None
    ) -> nn.Module:
        return self.unwrap_model(self._model_for(optimizer, model))

    # -- the schedule ----------------------------------------------------------------------------
    def _schedule(self, wrapped: PipelinedModel, key: Any, training: bool, loss: bool) -> Any:
        """The schedule for inputs of one shape (torch's stages fix their shapes on first use),
        with the loss or without (an evaluation without labels)."""
        found = wrapped._schedules.get((key, training, loss))
        if found is not None:
            return found
        from torch.distributed.pipelining.schedules import get_schedule_class

        c = self.config
        group = self._pp().get_group()
        num = c.pp_size * c.pp_virtual_stages
        stages = [
            pipeline_stage(module, i, num, self.device, group)
            for i, module in sorted(wrapped._stages.items())
        ]
        cls = get_schedule_class(c.pp_schedule)
        loss_fn = self._loss_fns[id(wrapped)] if loss else None
        target = stages if PP_SCHEDULES[c.pp_schedule][0] else stages[0]
        schedule = cls(target, n_microbatches=c.pp_microbatches, loss_fn=loss_fn, scale_grads=True)
        wrapped._schedules[(key, training, loss)] = schedule
        return schedule

    def _loss_scale(self) -> float:
        """The fp16 loss scale the next backward multiplies by (1.0 without a scaler)."""
        scaler = None if self.precision is None else self.precision.scaler
        if scaler is None or not scaler.is_enabled():
            return 1.0
        return float(scaler.get_scale())

    def run(self, wrapped: PipelinedModel, args: tuple, kwargs: dict) -> PipelineOutput:
        """One forward of the prepared model: the whole schedule (see the module docstring)."""
        labels = kwargs.pop("labels", None)
        mask = kwargs.pop("attention_mask", None)
        inputs = pipeline_inputs(args, kwargs)
        extra = padding_keywords(
            list(wrapped._stages.values()), wrapped.module, mask, inputs[0], self.device
        )
        batch = inputs[0].shape[0]
        micro = self.config.pp_microbatches
        if batch % micro:
            raise ValueError(
                f"pipeline parallel: a batch of {batch} samples does not split into "
                f"pp_microbatches={micro} equal micro-batches; use a batch size that "
                f"{micro} divides (or drop_last=True on the DataLoader)."
            )
        training = wrapped.training and torch.is_grad_enabled()
        if training and labels is None:
            raise ValueError(
                "pipeline parallel: in training the backward runs inside the forward, so the "
                "prepared model needs the labels: model(**batch) with a 'labels' entry, or "
                "model(inputs, labels=targets)."
            )
        if training and self._loss_fns[id(wrapped)] is None:
            raise ValueError(
                "pipeline parallel: this model has no built-in loss; give one with "
                "ParallelismConfig(pp_loss_fn=lambda output, labels: ...)."
            )
        target = labels if labels is not None and self._loss_fns[id(wrapped)] else None
        key = (tuple((tuple(t.shape), t.dtype) for t in inputs), bool(extra))
        loss_fn = self._loss_fns[id(wrapped)]
        if loss_fn is not None and isinstance(loss_fn.fn, TokenLoss):  # weigh micro-batches
            loss_fn.fn.per_batch(target, self.config.pp_microbatches)  # by their tokens
        schedule = self._schedule(wrapped, key, training, target is not None)
        feed = inputs if 0 in wrapped._stages else ()
        losses: list[torch.Tensor] | None = [] if target is not None else None
        if training:
            self._drop_unreleased(wrapped)
            params = [p for s in wrapped._stages.values() for p in s.parameters()]
            held = HeldGradients(params)
            if target is not None:
                held.applied = loss_fn.scale = self._loss_scale()
            with self._autocast():
                out = schedule.step(
                    *feed, target=target, losses=losses, **step_keywords(schedule), **extra
                )
            held.collect()
            wrapped._held = held
        else:
            held = None
            with self._autocast():
                out = schedule.eval(*feed, target=target, losses=losses, **extra)
        loss = self._share_loss(losses, target is not None)
        if held is not None and loss is not None and held.applied != 1.0:
            loss = loss / held.applied  # the schedule's losses carry the loss scale
        if held is not None and loss is not None:
            loss = held_loss(loss, held)
        logits = None if training else self._share_output(out)
        return PipelineOutput(loss=loss, logits=logits)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The run's precision around the stages (the user's forward, which the prepared
        model's precision wrapper would put under autocast, is not called)."""
        return contextlib.nullcontext() if self.precision is None else self.precision.autocast()

    @staticmethod
    def _drop_unreleased(wrapped: PipelinedModel) -> None:
        held = wrapped._held
        if held is not None and not held.done:  # a forward whose loss never saw backward
            held.done = True
        wrapped._held = None

    def _share_loss(self, losses: list[torch.Tensor] | None, wanted: bool) -> torch.Tensor | None:
        import torch.distributed as dist

        if not wanted:
            return None
        value = torch.zeros((), device=self.device, dtype=torch.float32)
        if losses:
            value = torch.stack([x.detach().float() for x in losses]).mean()
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        value = value.to(device)
        dist.broadcast(value, src=self._last_rank(), group=self._pp().get_group())
        return value.to(self.device)

    def _share_output(self, out: Any) -> Any:
        import torch.distributed as dist

        holder = [out.detach().cpu() if isinstance(out, torch.Tensor) else out]
        dist.broadcast_object_list(holder, src=self._last_rank(), group=self._pp().get_group())
        value = holder[0]
        return value.to(self.device) if isinstance(value, torch.Tensor) else value

    # -- the step --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        yield  # the schedule reduces each step's gradients itself

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        yield

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm over every stage (and every shard); returns that norm."""
        import torch.distributed as dist

        grads = [p.grad for p in parameters if p.grad is not None]
        total = _dtensor.grad_norm(grads, norm_type, self.device)
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        total = total.to(device)
        group = self._pp().get_group()
        if norm_type == float("inf"):
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        else:
            total = total**norm_type
            dist.all_reduce(total, group=group)
            total = total ** (1.0 / norm_type)
        _dtensor.scale_gradients(grads, total, max_norm)
        return total

    def clip_grad_value_(self, parameters: Iterable[nn.Parameter], clip_value: float) -> None:
        _dtensor.clip_grad_value(parameters, clip_value)

    # -- state -----------------------------------------------------------------------------------
    def _local_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This rank's weights under the model's names (DTensors where sharded)."""
        wrapped = _pipelined(model)
        state = {}
        for stage in wrapped._stages.values():
            for name, tensor in stage.state_dict().items():
                if not name.startswith("rotary."):
                    state[full_name(stage, name)] = tensor
        return state

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict on every process (each stage sends its weights)."""
        import torch.distributed as dist

        local = {}
        for name, tensor in sorted(self._local_state(model).items()):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            local[name] = full.detach().cpu()
        parts: list[Any] = [None] * self.config.pp_size
        dist.all_gather_object(parts, local, group=self._pp().get_group())
        merged = {k: v for part in parts for k, v in part.items()}
        order = list(self.unwrap_model(model).state_dict())
        return {k: merged[k] for k in order if k in merged}

    def load_model_state_dict(
        self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> Any:
        from torch.distributed.tensor import DTensor, distribute_tensor

        local = self._local_state(model)
        missing = sorted(set(local) - set(state_dict))
        if missing and strict:
            raise KeyError(f"the state dict misses {missing[:8]} of this pipeline stage.")
        with torch.no_grad():
            for name, target in local.items():
                if name not in state_dict:
                    continue
                value = state_dict[name].to(target.dtype)
                if isinstance(target, DTensor):
                    value = distribute_tensor(
                        value.to(target.device), target.device_mesh, target.placements
                    )
                _dtensor.local(target).copy_(_dtensor.local(value))
        return None

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """The whole optimizer state, one entry per parameter name (``state.<name>.<key>``,
        ``param_groups.<name>.<key>``), gathered from every stage onto every process."""
        import torch.distributed as dist

        local = _dcp.flat_optimizer_state(self.optimizer_model(optimizer, model), optimizer)
        local = {k: _dcp.full_tensor(v) for k, v in local.items()}
        parts: list[Any] = [None] * self.config.pp_size
        dist.all_gather_object(parts, local, group=self._pp().get_group())
        return {k: v for part in parts for k, v in part.items()}

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        model: nn.Module | None = None,
    ) -> None:
        """Load the entries of this rank's parameters from a state of `optimizer_state_dict`."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        inner = self.optimizer_model(optimizer, model)
        mine = _dcp.flat_optimizer_state(inner, optimizer)
        missing = sorted(set(mine) - set(state_dict))
        if missing:
            raise KeyError(f"the optimizer state misses {missing[:4]} of this pipeline stage.")
        values = {k: _dcp.laid_out_like(state_dict[k], mine[k]) for k in mine}
        set_optimizer_state_dict(inner, optimizer, values, options=_dcp.flat_options())

    # -- gradients and files: the pipeline's DCP folders, keyed by the model's own names ----
    def gradients_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return _dtensor.local_gradients(self.unwrap_model(model))

    def load_gradients_state(self, model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
        _dtensor.load_local_gradients(self.unwrap_model(model), grads)

    def save_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        writer: bool,
        write_full: Callable[[dict[str, torch.Tensor], Path], None],
    ) -> None:
        self._writer.save({"model": self._local_state(model)}, directory / pipeline_folder(name))

    def load_model_folder(self, model: nn.Module, folder: Path, strict: bool = True) -> None:
        state = {"model": {k: v.detach() for k, v in self._local_state(model).items()}}
        _dcp.load(state, folder)

    def save_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        *,
        writer: bool,
        model: nn.Module | None = None,
    ) -> None:
        state = {
            "optimizer": _dcp.flat_optimizer_state(
                self.optimizer_model(optimizer, model), optimizer
            )
        }
        self._writer.save(state, directory / pipeline_folder(name))


def _pipelined(model: nn.Module) -> PipelinedModel:
    inner = getattr(model, "_orig_mod", model)
    if not isinstance(inner, PipelinedModel):
        raise ValueError(f"expected the model prepared for pipeline parallel, got {type(model)}.")
    return inner


def _is_block(module: nn.Module) -> bool:
    """A repeated block worth recomputing (a decoder layer), not an embedding or a head."""
    return not isinstance(module, nn.Embedding | nn.Linear | nn.LayerNorm) and bool(
        list(module.children())
    )


def _refuse_ties_across(model: nn.Module, stages: list[nn.Module]) -> None:
    """A weight shared by modules of two stages would train apart on two ranks: refuse it."""
    where: dict[int, set[int]] = {}
    names: dict[int, list[str]] = {}
    for i, stage in enumerate(stages):
        for unit_prefix in stage.unit_names:
            unit = stage.get_submodule(unit_prefix)
            for n, p in unit.named_parameters(remove_duplicate=False):
                where.setdefault(id(p), set()).add(i)
                names.setdefault(id(p), []).append(f"{stage.unit_names[unit_prefix]}.{n}")
    for key, owners in where.items():
        if len(owners) > 1:
            raise ValueError(
                f"pipeline parallel: {sorted(set(names[key]))} are one tied weight in stages "
                f"{sorted(owners)}; stages on different ranks would train two copies apart. "
                f"Untie it (e.g. tie_word_embeddings=False) or keep those modules in one stage."
            )


def _build(request: StrategyRequest) -> PipelineStrategy:
    config = request.parallelism_config
    if config is None or not config.pp_enabled:
        raise ValueError(
            f"strategy 'pipeline' runs a ParallelismConfig with pp_size > 1; this run has "
            f"{config!r}. Pass ParallelismConfig(pp_size=...), or another strategy."
        )
    config, plugin = mesh_request(request)
    return PipelineStrategy(
        request.info, config, plugin, request.mixed_precision, clip_norm=request.clip_norm
    )


register_strategy(
    "pipeline",
    _build,
    claims=lambda r: (
        60 if r.parallelism_config is not None and r.parallelism_config.pp_enabled else None
    ),
)
