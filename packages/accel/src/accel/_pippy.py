"""Pipeline inference over the processes (the familiar path `accel.inference` re-exports it).

`prepare_pippy` splits a model into one stage per process with torch.distributed.pipelining
(traced with torch.export) and replaces its forward: the first process feeds the batch, cut
into micro-batches, and the last process returns the output (every process with
``gather_output=True``; the others get None).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import accel_state
from accel_parallel import balanced_stage_map, mend_pipeline_stage
from accel_state import PartialState


def generate_device_map(
    model: nn.Module,
    num_processes: int = 1,
    no_split_module_classes: Sequence[str] | None = None,
    max_memory: Any = None,
) -> dict[str, int]:
    """{module name: stage} splitting the model's parameters evenly over `num_processes`
    stages, in the order the modules are registered (never inside a `no_split` class): the
    pipeline plan's split by size (`accel_parallel.balanced_stage_map`)."""
    if max_memory is not None:
        raise ValueError(
            "generate_device_map(max_memory=...) is not used by accel's pipeline split, which "
            "balances parameters over the stages; drop max_memory."
        )
    no_split = no_split_module_classes or getattr(model, "_no_split_modules", None) or []
    return balanced_stage_map(model, num_processes, no_split)


def find_pippy_batch_size(args: Any, kwargs: Any) -> int | None:
    """The first dimension of the first tensor in `args` / `kwargs` (None when none)."""
    for value in [*(args or ()), *(kwargs or {}).values()]:
        found = accel_state.find_batch_size(value)
        if found is not None:
            return found
    return None


def _first_chunk(data: Any, num_chunks: int) -> Any:
    def one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim == 0 or t.shape[0] % num_chunks:
            raise ValueError(
                f"prepare_pippy: an example input has batch size {t.shape[0] if t.ndim else 0}, "
                f"which num_chunks={num_chunks} does not divide; give a batch divisible by it."
            )
        return t[: t.shape[0] // num_chunks]

    return accel_state.recursively_apply(one, data, error_on_other_type=False)


def build_pipeline(
    model: nn.Module,
    split_points: Sequence[str],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    num_chunks: int | None = None,
) -> Any:
    """This process's stage of `model` cut before each of `split_points`, under a GPipe
    schedule of `num_chunks` micro-batches."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    state = PartialState()
    num_chunks = num_chunks or state.num_processes
    if len(split_points) != state.num_processes - 1:
        raise ValueError(
            f"prepare_pippy: {len(split_points)} split points make {len(split_points) + 1} "
            f"stages, but there are {state.num_processes} processes (one stage each); give "
            f"{state.num_processes - 1} split points or split_points='auto'."
        )
    names = dict(model.named_modules())
    missing = [p for p in split_points if p not in names]
    if missing:
        raise ValueError(f"prepare_pippy: split points {missing} are not modules of the model.")
    pipe = pipeline(
        model,
        mb_args=_first_chunk(tuple(args), num_chunks),
        mb_kwargs=_first_chunk(dict(kwargs or {}), num_chunks) or None,
        split_spec={point: SplitPoint.BEGINNING for point in split_points},
    )
    stage = mend_pipeline_stage(pipe.build_stage(state.process_index, device=state.device))
    return ScheduleGPipe(stage, num_chunks)


def pippy_forward(
    forward: Callable[..., Any], num_chunks: int, gather_output: bool, *args: Any, **kwargs: Any
) -> Any:
    """Run one pipelined forward: the first process feeds the inputs, the last one returns
    the output (broadcast to every process with `gather_output`)."""
    state = PartialState()
    output = None
    if state.num_processes == 1:
        output = forward(*args, **kwargs)
    elif state.is_main_process:
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output and state.num_processes > 1:
        box = [output]
        accel_state.broadcast_object_list(box, from_process=state.num_processes - 1)
        output = accel_state.send_to_device(box[0], state.device)
    return output


def prepare_pippy(
    model: nn.Module,
    split_points: str | Sequence[str] | None = "auto",
    no_split_module_classes: Sequence[str] | None = None,
    example_args: tuple[Any, ...] = (),
    example_kwargs: dict[str, Any] | None = None,
    num_chunks: int | None = None,
    gather_output: bool = False,
) -> nn.Module:
    """Split `model` into one pipeline stage per process for inference.

    `split_points`: module names each stage starts at, or "auto" (parameters balanced over
    the processes). `example_args` / `example_kwargs`: a batch like the ones the model will
    get (its batch size divisible by `num_chunks`, the micro-batches, default one per
    process). Afterwards call the model on every process with the batch; the output is on the
    last process (on all with `gather_output=True`), None elsewhere.
    """
    state = PartialState()
    num_chunks = num_chunks or state.num_processes
    example_args = accel_state.send_to_device(tuple(example_args), "cpu")
    example_kwargs = accel_state.send_to_device(dict(example_kwargs or {}), "cpu")
    if split_points in ("auto", None):
        device_map = generate_device_map(model, state.num_processes, no_split_module_classes)
        split_points = [
            next(k for k, v in device_map.items() if v == i) for i in range(1, state.num_processes)
        ]
    elif isinstance(split_points, str):
        split_points = [split_points]
    split_points = list(split_points)
    schedule = build_pipeline(model, split_points, example_args, example_kwargs, num_chunks)
    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule
    model.hf_split_points = split_points

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        args = accel_state.send_to_device(args, state.device)
        kwargs = accel_state.send_to_device(kwargs, state.device)
        return pippy_forward(schedule.step, num_chunks, gather_output, *args, **kwargs)

    model.forward = types.MethodType(forward, model)
    return model
