"""Pipeline degrees of the training-memory estimate: each stage traced alone on one
micro-batch, then the schedule's rule for how many micro-batches it holds at once.

A stage is cut from the model as accel's pipeline strategy cuts it (`build_stages`: the
transformers adapter, or the config's `pp_plan`). Its input for one micro-batch comes from
running the stages before it on the meta device; then one forward, backward (from the loss
on the last stage, from a gradient of its output elsewhere) and optimizer step of the stage
alone run under fake tensors with torch's memory tracker. The schedule keeps the saved
activations of several micro-batches at once: all M for GPipe, and ``min(pp - s, M)`` on
stage s for 1F1B (the warm-up forwards before the first backward), so the activations the
stage's forward left behind are counted that many times. torch's stages also keep one
receive buffer per micro-batch for their input (every stage but the first) and for their
output's gradient (every stage but the last): the "communication" part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from accel_parallel import _memory_trace as trace

# the schedules whose stage count per rank is one and whose in-flight rule is known
_IN_FLIGHT: dict[str, Callable[[int, int, int], int]] = {
    "GPipe": lambda pp, stage, micro: micro,
    "1F1B": lambda pp, stage, micro: min(pp - stage, micro),
}


def pipeline_config(parallelism: Any, world_size: int, batch_size: int) -> tuple[str, int]:
    """(schedule, micro-batches) of `parallelism`, refused where the estimate has no rule."""
    pp = parallelism.pp_size
    schedule = getattr(parallelism, "pp_schedule", None) or "1F1B"
    micro = getattr(parallelism, "pp_microbatches", None) or pp
    if schedule not in _IN_FLIGHT or (getattr(parallelism, "pp_virtual_stages", None) or 1) > 1:
        raise NotImplementedError(
            f"pp_schedule={schedule!r}: the memory estimate knows how many micro-batches "
            f"{' and '.join(_IN_FLIGHT)} keep in flight (one stage per rank); estimate with "
            "one of them."
        )
    if world_size != pp or getattr(parallelism, "tp_size", 1) > 1:
        raise NotImplementedError(
            f"pp_size={pp} on world_size={world_size}: the estimate covers a pipeline over "
            f"every process (world_size={pp}, tp_size=1); a pipeline beside data or tensor "
            "parallel degrees is not estimated yet."
        )
    if batch_size % micro:
        raise ValueError(
            f"batch_size={batch_size} does not split into pp_microbatches={micro} equal "
            f"micro-batches; pass a batch size that {micro} divides."
        )
    return schedule, micro


def _micro(batch: Any, micro: int) -> Any:
    """The first of `micro` equal micro-batches of `batch` (a dict of tensors)."""
    return {k: v[: v.shape[0] // micro] for k, v in batch.items()}


def _loss_fn(model: nn.Module, parallelism: Any) -> Callable[..., torch.Tensor]:
    """The loss the pipeline strategy gives its last stage: the config's, or a transformers
    decoder's own."""
    from accel_parallel._pipeline_hf import is_transformers_decoder, transformers_loss

    loss = getattr(parallelism, "pp_loss_fn", None)
    if loss is None and is_transformers_decoder(model):
        return transformers_loss(model)
    if loss is None:
        raise ValueError(
            f"pipeline parallel: {type(model).__name__} has no built-in loss; give one with "
            "ParallelismConfig(pp_loss_fn=lambda output, labels: ...)."
        )
    return loss


def stage_inputs(template: nn.Module, plan: Any, pp: int, first: torch.Tensor) -> list[Any]:
    """Each stage's input for one micro-batch (fake tensors), from the stages before it run
    on a fake copy of the model (nothing allocated)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accel_parallel._pipeline_plan import build_stages

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    stages = build_stages(trace.fake_model(template, mode), plan, pp)
    inputs = []
    with mode, torch.no_grad():
        x = trace.faked(first, mode)
        for stage in stages:
            inputs.append(x)
            x = stage(x)
    return inputs


def stage_traces(
    template: nn.Module, parallelism: Any, batch: dict[str, torch.Tensor], micro: int,
    optimizer: Callable[..., torch.optim.Optimizer], mixed_precision: str,
) -> list[tuple[trace.Traced, int, int, int, int]]:  # fmt: skip
    """Per stage: the step of one micro-batch traced, the bytes its forward leaves saved,
    the bytes of its input and of its output (each a receive buffer per micro-batch), and of
    its trained parameters (its gradients)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accel_parallel._pipeline_plan import build_stages

    plan = getattr(parallelism, "pp_plan", None)
    stages = build_stages(template, plan, parallelism.pp_size)
    mb = _micro(batch, micro)
    inputs = stage_inputs(template, plan, parallelism.pp_size, mb["input_ids"])
    loss_fn = _loss_fn(template, parallelism)
    out = []
    for index, stage in enumerate(stages):
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = trace.fake_model(stage, mode)
        last = index == len(stages) - 1
        with mode:
            x = torch.empty(inputs[index].shape, dtype=inputs[index].dtype)
            if x.is_floating_point():
                x.requires_grad_(True)
            opt = optimizer(fake.parameters())
            if last:
                stage_loss: Callable[[Any], torch.Tensor] = _LastStageLoss(
                    loss_fn, trace.faked(mb["labels"], mode)
                )
            else:  # backpropagated from its output: a gradient of its shape
                stage_loss = _output
            traced = trace.run_traced(fake, opt, (x,), mixed_precision, False, stage_loss)
            saved = traced.forward_saved
            y_bytes = 0 if last else _nbytes(inputs[index + 1])
        grads = sum(_nbytes(p) for p in fake.parameters() if p.requires_grad)
        out.append((traced, saved, 0 if index == 0 else _nbytes(inputs[index]), y_bytes, grads))
    return out


def _output(y: torch.Tensor) -> torch.Tensor:
    return y


class _LastStageLoss:
    """The last stage's loss of its output and the labels; it holds the output through the
    backward, as the schedule does (its forward outputs live until their backward)."""

    def __init__(self, fn: Callable[..., torch.Tensor], labels: torch.Tensor) -> None:
        self.fn, self.labels = fn, labels
        self.output: torch.Tensor | None = None

    def __call__(self, output: torch.Tensor) -> torch.Tensor:
        self.output = output
        return self.fn(output, self.labels)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def in_flight(schedule: str, pp: int, stage: int, micro: int) -> int:
    return _IN_FLIGHT[schedule](pp, stage, micro)


def stage_parts(
    traced: trace.Traced, saved: int, received: int, sent: int, held: int, micro: int,
    gradient_bytes: int,
) -> dict[str, int]:  # fmt: skip
    """One stage's per-device parts over the schedule's step.

    Until the stage's first backward, it holds the activations of `held` micro-batches and
    no gradients: the traced peak plus `held - 1` forwards' saved activations. From then on
    (with more than one micro-batch) its gradients exist whole while later micro-batches run
    (accumulated in place): every traced moment with whole gradients, plus the other forwards
    still held while new ones start (when more micro-batches follow than it holds). One
    receive buffer per micro-batch for the input and for the output's gradient."""
    from accel_parallel._memory_engines import by_category

    first = by_category(traced.peak, trace.CATEGORY_OF)
    first["activations"] += (held - 1) * saved
    candidates = [first]
    if micro > 1:
        extra = (held - 1) * saved if micro > held else 0
        for moment in traced.moments:
            parts = by_category(moment, trace.CATEGORY_OF)
            parts["gradients"] = gradient_bytes
            parts["activations"] += extra
            candidates.append(parts)
    best = dict(max(candidates, key=lambda p: sum(p.values())))
    best["communication"] += micro * (received + sent)
    return best
