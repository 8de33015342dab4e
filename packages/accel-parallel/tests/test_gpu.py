"""The training-memory estimate against the peak a real step reaches on a CUDA GPU
(`torch.cuda.max_memory_allocated`), as tests/test_memory.py checks it on the CPU.

Bound: within 10% of the measured peak (the issue's bound), for the kernels the trace runs:
the estimate traces fake CPU tensors, where AdamW takes its one-tensor-at-a-time path, so
the measured step builds AdamW with foreach=False. CUDA's default AdamW (foreach) also holds
one temporary the size of all parameters at its step (`_foreach_sqrt` of the second moments),
which the CPU trace does not see: that step is allowed one parameter copy more.

The model is wide (about 142M parameters, 570 MB) so that what the trace cannot see is a
small share of the peak: the caching allocator rounds each block up to 512 bytes, and cuBLAS
keeps a workspace per handle (allocated by a warm-up matmul before the count starts).
"""

from __future__ import annotations

import functools

import pytest
import torch

from accel_parallel.memory import estimate_training_memory
from accel_testkit.models import Stack

pytestmark = pytest.mark.gpu

BOUND = 0.10
WIDTH, HIDDEN, DEPTH, BATCH = 2048, 8192, 4, 1024
MLP = functools.partial(
    Stack, width=WIDTH, depth=DEPTH, hidden=HIDDEN, in_features=WIDTH, out_features=WIDTH
)
AUTOCAST = {"no": None, "bf16": torch.bfloat16}


def _batch(model: torch.nn.Module) -> dict:
    return {"args": (torch.randn(BATCH, WIDTH),)}


def _measured_peak(mixed_precision: str, foreach: bool) -> tuple[int, int]:
    """(peak bytes above what was allocated before the model was built, parameter bytes) of
    two AdamW steps on cuda:0: forward, the output's mean, backward, step, zero_grad."""
    device = torch.device("cuda", 0)
    dtype = AUTOCAST[mixed_precision]
    warm = torch.nn.Linear(64, 64, device=device)  # cuBLAS's workspaces, outside the count
    with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        warm(torch.randn(8, 64, device=device)).sum().backward()
    del warm
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    model = MLP().to(device)
    opt = torch.optim.AdamW(model.parameters(), foreach=foreach)
    x = torch.randn(BATCH, WIDTH, device=device)
    for _ in range(2):
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(x).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    del model, opt, x, loss
    torch.cuda.empty_cache()
    return peak, params


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_estimate_is_within_the_bound_of_cudas_measured_peak(mixed_precision: str) -> None:
    (row,) = estimate_training_memory(
        MLP, world_size=1, batch=_batch, engines=["ddp"], offload=[False],
        reshard_after_forward=[True], mixed_precision=mixed_precision,
    )  # fmt: skip
    assert row.method.startswith("traced"), row.method
    estimate = row.peak_bytes
    measured, params = _measured_peak(mixed_precision, foreach=False)
    case = (mixed_precision, estimate, measured)
    assert abs(estimate - measured) <= BOUND * measured, case
    # CUDA's default AdamW: one temporary the size of the parameters more, at most
    default, _ = _measured_peak(mixed_precision, foreach=True)
    case = (mixed_precision, estimate, default, params)
    assert (1 - BOUND) * default - params <= estimate <= (1 + BOUND) * default, case
