"""accelerate's `GatheredParameters`: DeepSpeed's ZeRO-3 gather where the parameters are
partitioned, a no-op context everywhere else (DDP, FSDP2, ZeRO 0-2, one device)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn


def _listed(params: Any) -> list[Any]:
    """A single parameter or an iterable of them (a generator too, read once), as a list;
    anything else is no parameter, as DeepSpeed ignores it."""
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, Iterable):
        return list(params)
    return []


@contextlib.contextmanager
def GatheredParameters(
    params: Any,
    modifier_rank: int | None = None,
    fwd_module: nn.Module | None = None,
    enabled: bool = True,
) -> Iterator[None]:
    """Inside the block every ZeRO-3 partitioned parameter among `params` holds its full
    tensor on every rank; on exit the parameters are partitioned again, after `modifier_rank`'s
    values (when given) are broadcast to every rank, so a change made there is kept.

    ZeRO-3 is recognized on the parameters themselves (DeepSpeed marks each partitioned one
    with `ds_id`), so the block is DeepSpeed's `deepspeed.zero.GatheredParameters` exactly
    where accelerate uses it, and a no-op for parameters that are whole already; DeepSpeed is
    imported only then."""
    listed = _listed(params)
    if not enabled or not any(hasattr(p, "ds_id") for p in listed):
        yield
        return
    import deepspeed  # installed: only DeepSpeed's ZeRO-3 marks a parameter with ds_id

    with deepspeed.zero.GatheredParameters(
        listed, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled
    ):
        yield
