"""The training step written raw and through an accelerator, a step that does no work, and an
exact count of the Python calls a step makes (tools/bench/bench_accelerator.py and
bench_step_overhead.py time these loops; packages/accel/tests/test_step_overhead.py counts).

Counting, not timing, is what a shared machine reproduces: `count_calls` records every
'call' event of `sys.setprofile` (a Python frame entered: a function, or a generator
resumed) and leaves out C calls ('c_call'), which cost a fraction of a Python frame and which
`setprofile` reports only for some callables. Each call is filed under where its code lives:
accel's packages (a module named accel or accel_*, not this kit), the loop's own frame, or
everything else (torch, the standard library).
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "CallCount",
    "Loop",
    "NoOpLoss",
    "NoOpModel",
    "NoOpOptimizer",
    "accelerator_loop",
    "count_calls",
    "identity_loss",
    "raw_loop",
]

Loop = Callable[[Sequence[tuple[Any, ...]]], None]


def raw_loop(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    accumulation: int = 1,
    loss_fn: Callable[..., torch.Tensor] = nn.functional.cross_entropy,
) -> Loop:
    """``loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()``; with
    `accumulation` K > 1 the loss is divided by K and the optimizer steps (and is zeroed) on
    every K-th batch."""

    def run(batches: Sequence[tuple[Any, ...]]) -> None:
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    def run_accumulating(batches: Sequence[tuple[Any, ...]]) -> None:
        for i, (x, y) in enumerate(batches, 1):
            loss = loss_fn(model(x), y) / accumulation
            loss.backward()
            if i % accumulation == 0:
                opt.step()
                opt.zero_grad()

    return run if accumulation == 1 else run_accumulating


def accelerator_loop(
    acc: Any,
    model: nn.Module,
    opt: Any,
    loss_fn: Callable[..., torch.Tensor] = nn.functional.cross_entropy,
) -> Loop:
    """The loop of accel's and accelerate's documentation (both spell it the same), on what
    the accelerator's `prepare` returned; its gradient accumulation is the accelerator's."""

    def run(batches: Sequence[tuple[Any, ...]]) -> None:
        for x, y in batches:
            with acc.accumulate(model):
                loss = loss_fn(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()

    return run


# -- a step that does no work: what is left is the wrapper's own code ---------------------------
class NoOpLoss:
    """Stands for a loss tensor: dividing it (by K) gives it back, and its backward does
    nothing. A real tensor's backward would put ~5 us of autograd engine, and its jitter, in
    both loops, around a difference of about 1 us."""

    __slots__ = ()

    def __truediv__(self, other: Any) -> NoOpLoss:
        return self

    def backward(
        self, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False,
        inputs: Any = None,
    ) -> None:  # fmt: skip
        """Tensor.backward's signature, so that a call passes its arguments as it would."""
        return None


class NoOpModel(nn.Module):
    """A module with one parameter (for the optimizer) whose forward returns the same
    `NoOpLoss`."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))
        self.output = NoOpLoss()

    def forward(self, x: Any) -> NoOpLoss:
        return self.output


def identity_loss(output: Any, target: Any) -> Any:
    """The loss is the model's output."""
    return output


class NoOpOptimizer(torch.optim.Optimizer):
    """An optimizer whose step and zero_grad do nothing."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    # torch.optim.Optimizer wraps a step without this mark in its profiling hooks (~5 us).
    step.hooked = True  # type: ignore[attr-defined]

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


# -- counting ---------------------------------------------------------------------------------
def _is_accel(module: str) -> bool:
    top = module.partition(".")[0]
    return (top == "accel" or top.startswith("accel_")) and top != "accel_testkit"


@dataclass(frozen=True)
class CallCount:
    """The Python calls of one run, per function: `accel` (accel's packages), `other` (torch,
    the standard library, the model's own code), and the loop's own frames (`loop`)."""

    accel: Counter[str]
    other: Counter[str]
    loop: int

    @property
    def total(self) -> int:
        return sum(self.accel.values()) + sum(self.other.values()) + self.loop


def count_calls(loop: Loop, batches: Sequence[tuple[Any, ...]]) -> CallCount:
    """The Python calls of `loop(batches)`, exactly. The garbage collector is off meanwhile,
    so that no collection (and no callback of one) lands in the count at random."""
    accel: Counter[str] = Counter()
    other: Counter[str] = Counter()
    loop_code = loop.__code__
    loop_frames = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal loop_frames
        if event != "call":
            return
        code = frame.f_code
        if code is loop_code:
            loop_frames += 1
            return
        module = frame.f_globals.get("__name__", "")
        name = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        (accel if _is_accel(module) else other)[name] += 1

    enabled = gc.isenabled()
    gc.disable()
    try:
        sys.setprofile(profile)
        try:
            loop(batches)
        finally:
            sys.setprofile(None)
    finally:
        if enabled:
            gc.enable()
    return CallCount(accel, other, loop_frames)
