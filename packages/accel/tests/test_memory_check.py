"""The opt-in memory check at `prepare`: a warning when the predicted peak exceeds the memory
given, naming the cheapest change that fits; nothing when off or when it fits."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_testkit.models import Stack

MLP = functools.partial(Stack, width=256, depth=4, hidden=1024, in_features=256, out_features=256)


def _prepare(memory_check: str | None, fsdp: bool = False) -> list[str]:
    """prepare an MLP, AdamW and a DataLoader of 2048-sample batches; the warnings raised."""
    from accel import Accelerator
    from accel_parallel import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin() if fsdp else None
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    accelerator.memory_check = memory_check
    model = MLP()
    loader = DataLoader(TensorDataset(torch.randn(2048, 256)), batch_size=2048)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
    return [str(w.message) for w in caught if "predicted peak" in str(w.message)]


def test_off_by_default_and_quiet_when_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEL_MEMORY_CHECK", raising=False)
    assert _prepare(None) == []
    assert _prepare("1GiB") == []


def test_warns_with_the_cheapest_change_that_fits() -> None:
    # one process: weights 8.5 MiB, AdamW 17 MiB and the step's activations: 86.8 MiB at the
    # peak; half the micro-batch 56.8 MiB, activation checkpointing 62.8 MiB (the estimates)
    (message,) = _prepare("60MiB")
    assert "predicted peak 86.8 MiB per device for Stack with ddp on 1 process" in message
    assert "exceeds the device memory 60.0 MiB" in message
    assert "the cheapest change that fits: half the micro-batch (peak 56.8 MiB)" in message
    (message,) = _prepare("63MiB")  # both fit: neither moves bytes; no recomputation first
    assert "the cheapest change that fits: half the micro-batch" in message
    (message,) = _prepare("1MiB")
    assert "nothing of micro-batch / 2" in message
    with pytest.raises(ValueError, match="'36 parsecs'"):
        _prepare("36 parsecs")


def _fsdp_on_two() -> list[str]:
    from accel_state import PartialState

    PartialState(cpu=True)
    return _prepare("70MiB", fsdp=True)  # the estimate: 78.5 MiB per process


def test_fsdp2_on_two_processes() -> None:
    from accel_state.testing import run_distributed

    rank0, rank1 = run_distributed(_fsdp_on_two, world_size=2, timeout=180)
    assert rank1 == []  # the main process warns
    (message,) = rank0
    assert "with fsdp2 on 2 process(es)" in message and "cheapest change that fits" in message
