"""Behaviours an accelerate script relies on, beyond the names existing."""

from __future__ import annotations

import pytest
import torch

from accel import Accelerator, AcceleratorState, AutocastKwargs


@pytest.fixture(autouse=True)
def _fresh_state():
    yield
    AcceleratorState._reset_state()


def test_autocast_handler_applies_to_its_block() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    a = torch.randn(4, 4)
    with acc.autocast():
        assert (a @ a).dtype == torch.bfloat16
    with acc.autocast(autocast_handler=AutocastKwargs(enabled=False)):
        assert (a @ a).dtype == torch.float32
    with acc.autocast():
        assert (a @ a).dtype == torch.bfloat16


def test_accelerator_state_reads_what_the_accelerator_chose() -> None:
    Accelerator(cpu=True, mixed_precision="bf16")
    state = AcceleratorState()
    assert state.mixed_precision == "bf16"
    assert state.num_processes == 1
