"""The umbrella's configuration records, and sorting of `kwargs_handlers`."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass
class ProjectConfiguration:
    """Where a project writes, and how checkpoints are named and kept.

    The first six fields are accelerate's, in its order (``ProjectConfiguration("out", ...)``);
    accel's ``fsync`` and ``async_save`` follow, keyword-only.

    - ``project_dir``: the root; ``logging_dir`` defaults to it.
    - ``automatic_checkpoint_naming``: ``save_state()`` writes ``<project_dir>/checkpoints/
      checkpoint_<n>`` with n counting up (and continuing after a resume).
    - ``total_limit``: keep at most this many complete checkpoints (older ones are removed
      only after the new one is complete).
    - ``iteration``: the number of the next automatic checkpoint.
    - ``save_on_each_node``: write the checkpoint on every node's main process (no shared disk).
    - ``fsync``: flush every checkpoint file to disk before the checkpoint is marked complete
      (the default). Off, saving is faster and a crashed process still never leaves a broken
      newest checkpoint (files are complete in the OS cache before the rename), but an OS
      crash or power loss shortly after a save can lose it.
    - ``async_save``: ``save_state()`` returns once every tensor is copied to CPU memory; the
      files are written in a background thread and the checkpoint counts as complete only
      when its marker is written. The next ``save_state``, ``load_state`` or
      ``wait_for_checkpoint()`` waits for it first. A process killed meanwhile leaves the
      previous checkpoint whole and loadable.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    _: dataclasses.KW_ONLY
    fsync: bool = True
    async_save: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise ValueError(
                f"total_limit={self.total_limit}: keep at least 1 checkpoint, or None."
            )
        if self.iteration < 0:
            raise ValueError(f"iteration={self.iteration}: must be >= 0.")

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclasses.dataclass
class ProfileKwargs:
    """Options of `Accelerator.profile` (torch.profiler), accelerate's fields in its order.

    ``activities``: "cpu", "cuda", ... (default: cpu, plus the accelerator when there is one);
    ``schedule_option``: keyword arguments of ``torch.profiler.schedule`` (wait, warmup,
    active, repeat, skip_first); ``output_trace_dir``: write a Chrome trace per process there.
    """

    activities: tuple[str, ...] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepMetricsKwargs:
    """Options of the step metrics; passing it in `kwargs_handlers` turns them on.

    ``print_every``: print the metrics line on the main process every this many optimizer
    steps (0: never). ``log_every``: send the metrics to `accelerator.log` every this many
    optimizer steps (0: never)."""

    print_every: int = 10
    log_every: int = 1

    def __post_init__(self) -> None:
        for name in ("print_every", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"StepMetricsKwargs({name}={value!r}): expected a whole number of optimizer "
                    f"steps >= 0 (0 turns it off)."
                )


@functools.cache
def _handler_slots() -> dict[type, str]:
    """Each handler type's slot (the packages that own them imported when a handler is given)."""
    from accel_parallel import DistributedDataParallelKwargs
    from accel_precision import (
        AORecipeKwargs,
        AutocastKwargs,
        FP8RecipeKwargs,
        GradScalerKwargs,
        TERecipeKwargs,
    )
    from accel_state import InitProcessGroupKwargs

    return {
        DistributedDataParallelKwargs: "ddp",
        GradScalerKwargs: "scaler",
        AutocastKwargs: "autocast",
        InitProcessGroupKwargs: "init_process_group",
        FP8RecipeKwargs: "fp8",
        TERecipeKwargs: "fp8",
        AORecipeKwargs: "fp8",
        ProfileKwargs: "profile",
        StepMetricsKwargs: "step_metrics",
    }


def sort_kwargs_handlers(handlers: Iterable[Any] | None) -> dict[str, Any]:
    """Map each handler to its slot; two handlers of one kind, or an unknown one, is an error."""
    slots: dict[str, Any] = {}
    for handler in handlers or ():
        slot = _handler_slots().get(type(handler))
        if slot is None:
            known = sorted(t.__name__ for t in _handler_slots())
            raise TypeError(f"kwargs_handlers got {handler!r}; accepted types: {known}.")
        if slot in slots:
            raise ValueError(
                f"kwargs_handlers holds two {slot} handlers ({slots[slot]!r} and {handler!r}); "
                f"pass one."
            )
        slots[slot] = handler
    return slots
