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

from accel_parallel._checkpoint_files import pipeline_folder
from accel_parallel._fsdp import _checkpoint_blocks, _local
from accel_parallel._mesh import MeshStrategy, mesh_request
from accel_parallel._pipeline_plan import (
    PP_SCHEDULES,
    DecoderStage,
    TokenLoss,
    build_stages,
    full_name,
    is_transformers_decoder,
    stage_to_rank,
    stage_units,
    transformers_loss,
)
from accel_parallel._pipeline_state import (
    full_tensor,
    laid_out_like,
    load_flat_optimizer,
    optim_options,
    optim_state,
)
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._tp import _refuse_split_ties, resolve_plan


class PipelineOutput(dict):
    """What the prepared model returns: ``loss`` (the mean over micro-batches, on every rank;
    None without labels) and ``logits`` (the last stage's output, in eval mode)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _HeldGradients(torch.autograd.Function):
    """The pipeline's loss: its backward moves the gradients the schedule computed into
    ``.grad``, multiplied by the incoming gradient."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, anchor: torch.Tensor, held: Any) -> torch.Tensor:
        ctx.held = held
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.held.release(float(grad))
        return None, None, None


class _Held:
    """Gradients one schedule step computed, and those accumulated before it."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.applied = 1.0
        self.before = [p.grad for p in params]
        for p in params:
            p.grad = None
        self.done = False

    def collect(self) -> None:
        self.fresh = [p.grad for p in self.params]
        for p, before in zip(self.params, self.before):
            p.grad = before

    def release(self, scale: float) -> None:
        """Add the held gradients to ``.grad``, times `scale` over the loss scale the schedule's
        backward already ran with (`applied`)."""
        scale /= self.applied
        if self.done:
            raise RuntimeError("backward ran twice on one pipeline loss.")
        self.done = True
        for p, fresh in zip(self.params, self.fresh):
            if fresh is None:
                continue
            if scale != 1.0:
                _local(fresh).mul_(scale)
            if p.grad is None:
                p.grad = fresh
            else:
                _local(p.grad).add_(_local(fresh))


class _ScaledLoss:
    """The schedule's loss function, multiplied by the fp16 loss scale of the step (so the
    stages' backward runs on the scaled loss, as a plain fp16 backward does)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.scale = 1.0

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        loss = self.fn(output, target)
        return loss * self.scale if self.scale != 1.0 else loss


class PipelinedModel(nn.Module):
    """The prepared model of a pipeline run: ``module`` is the user's model (this rank's
    stages hold real weights, the others are on the meta device)."""

    def __init__(self, module: nn.Module, strategy: PipelineStrategy, stages: dict) -> None:
        super().__init__()
        self.module = module
        self._strategy = strategy
        self._stages = stages  # stage index -> stage module (this rank's)
        self._schedules: dict[Any, Any] = {}
        self._held: _Held | None = None
        self.config = getattr(module, "config", None)

    def forward(self, *args: Any, **kwargs: Any) -> PipelineOutput:
        return self._strategy.run(self, args, kwargs)


class PipelineStrategy(MeshStrategy):
    """Pipeline stages over ``pp``, with tensor parallel and FSDP2 inside each stage."""

    supports_no_sync = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = "pipeline"
        self.recompute = self.plugin.activation_checkpointing
        self._loss_fns: dict[int, _ScaledLoss | None] = {}

    # accelerate has no pipeline engine of this kind: the familiar API reports the process
    # topology (not FSDP), whatever the stages shard with.
    @property
    def fsdp_plugin(self) -> None:
        return None

    def distributed_type(self, topology: Any) -> Any:
        return topology

    # -- the pipeline group --------------------------------------------------------------------
    def _pp(self) -> Any:
        return self.config.sub_mesh("pp", self.device.type)

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
        wrapped, optimizers = super().prepare(models, optimizers)
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
                _checkpoint_blocks(stage, [u for u in units if _is_block(u)] or units)
            if self.shards:
                self._shard(stage, units)
        wrapped = PipelinedModel(model, self, mine)
        self._loss_fns[id(wrapped)] = _ScaledLoss(loss) if loss is not None else None
        return wrapped

    def _tensor_parallel(self, model: nn.Module, mine: dict) -> None:
        from torch.distributed.tensor.parallel import parallelize_module

        handler = self.config.tp_handler
        sequence = bool(handler and handler.sequence_parallel)
        resolved = resolve_plan(model, self.config.tp_plan, sequence)
        _refuse_split_ties(model, resolved)
        owned = [name for s in mine.values() for name in s.unit_names.values()]
        mesh = self.config.sub_mesh("tp", self.device.type)
        for stage in mine.values():  # activations between stages: this rank's slice
            if sequence and hasattr(stage, "seq_shards"):
                stage.seq_shards = self.config.tp_size
        for name, style in resolved.items():
            if any(name == o or name.startswith(f"{o}.") for o in owned):
                parallelize_module(model.get_submodule(name), mesh, style)

    def _shard(self, stage: nn.Module, units: list[nn.Module]) -> None:
        from torch.distributed.fsdp import fully_shard

        kwargs = {
            "mesh": self._device_mesh(),
            "reshard_after_forward": self.plugin.reshard_after_forward,
            "mp_policy": self._mp_policy(),
            "offload_policy": self._offload_policy(),
        }
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(stage, **kwargs)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        inner = super().unwrap_model(model)
        return inner.module if isinstance(inner, PipelinedModel) else inner

    # -- the schedule ----------------------------------------------------------------------------
    def _schedule(self, wrapped: PipelinedModel, key: Any, training: bool, loss: bool) -> Any:
        """The schedule for inputs of one shape (torch's stages fix their shapes on first use),
        with the loss or without (an evaluation without labels)."""
        found = wrapped._schedules.get((key, training, loss))
        if found is not None:
            return found
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import get_schedule_class

        c = self.config
        group = self._pp().get_group()
        num = c.pp_size * c.pp_virtual_stages
        stages = [
            PipelineStage(module, i, num, self.device, group=group)
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
        inputs = self._inputs(wrapped, args, kwargs)
        extra = _padding(wrapped, mask, inputs[0], self.device)
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
            held = _Held(params)
            if target is not None:
                held.applied = loss_fn.scale = self._loss_scale()
            with self._autocast():
                out = schedule.step(
                    *feed, target=target, losses=losses, return_outputs=False, **extra
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
            anchor = torch.zeros((), device=loss.device, requires_grad=True)
            loss = _HeldGradients.apply(loss, anchor, held)
        logits = None if training else self._share_output(out)
        return PipelineOutput(loss=loss, logits=logits)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The run's mixed precision around the stages (the user's forward is not called)."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mixed_precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def _inputs(self, wrapped: PipelinedModel, args: tuple, kwargs: dict) -> tuple:
        name = "input_ids" if "input_ids" in kwargs else None
        if name is None and len(kwargs) == 1 and not args:
            name = next(iter(kwargs))
        inputs = (*args, kwargs.pop(name)) if name else args
        if kwargs or not inputs:
            raise ValueError(
                f"pipeline parallel: the prepared model takes its input (input_ids, or one "
                f"positional tensor) and labels=...; got keywords {sorted(kwargs)} and "
                f"{len(args)} positional arguments."
            )
        return tuple(inputs)

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
        total = _norm(grads, norm_type, self.device)
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        total = total.to(device)
        group = self._pp().get_group()
        if norm_type == float("inf"):
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        else:
            total = total**norm_type
            dist.all_reduce(total, group=group)
            total = total ** (1.0 / norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            local = _local(g)
            local.mul_(coef.to(local.device, local.dtype))
        return total

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
                _local(target).copy_(_local(value))
        return None

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """The whole optimizer state, one entry per parameter name (``state.<name>.<key>``,
        ``param_groups.<name>.<key>``), gathered from every stage onto every process."""
        import torch.distributed as dist

        local = optim_state(self.unwrap_model(self._model_for(optimizer, model)), optimizer)
        local = {k: full_tensor(v) for k, v in local.items()}
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

        inner = self.unwrap_model(self._model_for(optimizer, model))
        mine = optim_state(inner, optimizer)
        missing = sorted(set(mine) - set(state_dict))
        if missing:
            raise KeyError(f"the optimizer state misses {missing[:4]} of this pipeline stage.")
        values = {k: laid_out_like(state_dict[k], mine[k]) for k in mine}
        set_optimizer_state_dict(inner, optimizer, values, options=optim_options())

    def save_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        writer: bool,
        write_full: Callable[[dict[str, torch.Tensor], Path], None],
    ) -> None:
        self._dcp_save({"model": self._local_state(model)}, directory / pipeline_folder(name))

    def load_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        read_full: Callable[[Path], dict[str, torch.Tensor]],
        strict: bool = True,
    ) -> None:
        import torch.distributed.checkpoint as dcp

        folder = directory / pipeline_folder(name)
        if not folder.is_dir():
            state = read_full(directory / name)
            self.load_model_state_dict(model, state, strict=strict)
            return
        state = {"model": {k: v.detach() for k, v in self._local_state(model).items()}}
        dcp.load(state, checkpoint_id=folder)

    def save_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        *,
        writer: bool,
        model: nn.Module | None = None,
    ) -> None:
        inner = self.unwrap_model(self._model_for(optimizer, model))
        state = {"optimizer": optim_state(inner, optimizer)}
        self._dcp_save(state, directory / pipeline_folder(name))

    def load_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        model: nn.Module | None = None,
    ) -> None:
        load_flat_optimizer(
            self.unwrap_model(self._model_for(optimizer, model)),
            optimizer,
            directory / pipeline_folder(name),
        )


def _padding(
    wrapped: PipelinedModel, mask: torch.Tensor | None, ids: torch.Tensor, device: torch.device
) -> dict[str, torch.Tensor]:
    """The keywords that hand each stage its micro-batch's slice of a padding mask (every
    pipeline rank holds the whole batch); none for a mask without padding."""
    if mask is None or bool(torch.all(mask != 0)):
        return {}
    if not all(isinstance(s, DecoderStage) for s in wrapped._stages.values()):
        raise ValueError(
            f"pipeline parallel: a padding attention_mask reaches the stages of a transformers "
            f"decoder model only; {type(wrapped.module).__name__} is cut by a module plan whose "
            f"stages take one input. Pack the sequences to one length (labels -100 where no "
            f"loss is wanted)."
        )
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(
            f"pipeline parallel: attention_mask of shape {tuple(mask.shape)} for input_ids of "
            f"shape {tuple(ids.shape)}; give a (batch, sequence) mask like the input_ids."
        )
    return {"attention_mask": mask.to(device)}


def _pipelined(model: nn.Module) -> PipelinedModel:
    inner = getattr(model, "_orig_mod", model)
    if not isinstance(inner, PipelinedModel):
        raise ValueError(f"expected the model prepared for pipeline parallel, got {type(model)}.")
    return inner


def _norm(grads: list[torch.Tensor], norm_type: float, device: torch.device) -> torch.Tensor:
    """This rank's gradient norm (DTensor groups reduced over their meshes)."""
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
    return torch.linalg.vector_norm(
        torch.stack([n.to(device, torch.float32) for n in norms]), norm_type
    )


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
