"""What carries a pipeline step's results back into the familiar loop: the output the
prepared model returns, and the gradients the schedule computed, held back until
``accelerator.backward(loss)`` runs (then multiplied by what flows into that backward, the
accumulation divisor, over the fp16 loss scale the schedule's backward already ran with).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel_parallel import _dtensor


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


class HeldGradients:
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
                _dtensor.local(fresh).mul_(scale)
            if p.grad is None:
                p.grad = fresh
            else:
                _dtensor.local(p.grad).add_(_dtensor.local(fresh))


class ScaledLoss:
    """The schedule's loss function, multiplied by the fp16 loss scale of the step (so the
    stages' backward runs on the scaled loss, as a plain fp16 backward does)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.scale = 1.0

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        loss = self.fn(output, target)
        return loss * self.scale if self.scale != 1.0 else loss


def held_loss(loss: torch.Tensor, held: HeldGradients) -> torch.Tensor:
    """`loss` whose backward releases the `held` gradients into ``.grad``."""
    anchor = torch.zeros((), device=loss.device, requires_grad=True)
    return _HeldGradients.apply(loss, anchor, held)
