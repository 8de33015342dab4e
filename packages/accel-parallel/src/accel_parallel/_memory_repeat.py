"""A model made of N identical blocks, traced with a few of them and extrapolated to N.

A transformers decoder is a ModuleList of N layers of one class and the same parameter
shapes. Each part of a traced row (weights, gradients, ..., at the row's peak) is then an
affine function of the number of layers as long as the peak stays at the same moment of the
step, so the estimate (opt-in) traces the model with `FIRST`, `FIRST + 1` and `FIRST + 2`
blocks, checks that the three rows lie on one line (to the byte, part by part), and extends
the line to N. A model whose blocks differ, or rows that do not lie on one line, is traced
whole. A row is a maximum over the step's moments, so a moment that grows faster with the
blocks can overtake the peak past `FIRST + 2` blocks; the line is then short of the whole
trace (a Llama of 8 small layers at batch 4 x 128: 8 KiB in 27 MB for ZeRO-1).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from torch import nn

# the fewest blocks a traced copy holds: with fewer, the peak of a large-vocabulary model can
# sit at another moment of the step (the logits) than with all of them
FIRST = 3


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The ModuleList of identical blocks (`container`) and how many it holds."""

    container: nn.ModuleList
    count: int


def _signature(block: nn.Module) -> tuple:
    shapes = tuple((n, tuple(p.shape), p.dtype, p.requires_grad)
                   for n, p in block.named_parameters())  # fmt: skip
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in block.named_buffers())
    return type(block), shapes, buffers


def repeated_blocks(model: nn.Module) -> Blocks | None:
    """The largest ModuleList (by parameters) whose children share a class and parameter
    shapes, own their parameters (none shared between blocks) and number more than
    FIRST + 2; None when the model has none."""
    best: Blocks | None = None
    best_numel = 0
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) <= FIRST + 2:
            continue
        children = list(module)
        if len({_signature(c) for c in children}) != 1:
            continue
        params = [p for c in children for p in c.parameters()]
        if len({id(p) for p in params}) != len(params):
            continue
        numel = sum(p.numel() for p in params)
        if numel > best_numel:
            best, best_numel = Blocks(module, len(children)), numel
    return best


@contextlib.contextmanager
def truncated(blocks: Blocks | None, count: int | None) -> Iterator[None]:
    """The container holds only its first `count` blocks for the duration (nothing when
    `blocks` or `count` is None)."""
    if blocks is None or count is None:
        yield
        return
    container = blocks.container
    saved = container._modules
    container._modules = dict(list(saved.items())[:count])
    try:
        yield
    finally:
        container._modules = saved


def extrapolate(rows: list[dict[str, int]], count: int) -> dict[str, int] | None:
    """Each part at `count` blocks from the parts traced with FIRST, FIRST + 1 and FIRST + 2
    blocks; None when the three are not on one line for some part."""
    first, second, third = rows
    out = {}
    for key, value in first.items():
        step = second[key] - value
        if third[key] - second[key] != step:
            return None
        out[key] = value + (count - FIRST) * step
    return out
