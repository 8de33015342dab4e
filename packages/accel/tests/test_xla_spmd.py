"""SPMD over the XLA devices of one host ("xla_spmd"), on XLA's CPU device.

One process drives ``CPU_NUM_DEVICES`` virtual devices (CI runs this file with 2 and with 4):
each batch is sharded over the devices along its first dimension, the parameters are
replicated, and the compiled step reduces the gradients. It must end where one eager CPU
process ends on the same global batches. The runtime's SPMD mode is on from the first XLA
tensor, so this file runs in a process of its own (not beside test_xla.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _xla_cases import (
    ACCUMULATE,
    BOUND,
    CLIP,
    eager_reference,
    make_net,
    skip_without_xla_cpu,
    train_accelerated,
)

from accel import Accelerator, DistributedType
from accel_testkit.tolerance import assert_same_training

pytestmark = [
    skip_without_xla_cpu,
    pytest.mark.skipif(
        int(os.environ.get("CPU_NUM_DEVICES", "1")) < 2,
        reason="SPMD needs several devices: run with CPU_NUM_DEVICES=2 or 4 (CI's XLA lane does)",
    ),
]


def test_spmd_over_the_devices_equals_one_eager_cpu_process() -> None:
    import torch_xla
    import torch_xla.runtime as xr

    accelerator = Accelerator(strategy="xla_spmd", gradient_accumulation_steps=ACCUMULATE)
    devices = int(os.environ["CPU_NUM_DEVICES"])
    assert xr.is_spmd() and xr.global_runtime_device_count() == devices
    assert accelerator.distributed_type == DistributedType.XLA
    assert accelerator.device.type == "xla" and accelerator.num_processes == 1
    seen = []
    original = accelerator.strategy.batch_feeder()

    def watch(batches):  # each batch arrives sharded over every device
        for batch in original(batches):
            spec = torch_xla._XLAC._get_xla_sharding_spec(batch[0])
            seen.append(spec)
            yield batch

    accelerator.strategy.batch_feeder = lambda: watch
    got, want = train_accelerated(accelerator), eager_reference()
    assert seen and all(f"devices=[{devices},1]" in s for s in seen), seen[:2]
    assert min(want["norms"]) > CLIP
    for a, b in zip(got["norms"], want["norms"]):
        assert abs(a - b) <= BOUND * b
    # the compiled all-reduce adds a sum of `devices` terms to each gradient
    assert_same_training(got["state"], want["state"], make_net().state_dict(), 2 * BOUND)
    # the state comes back whole, on the host
    assert all(t.device.type == "cpu" for t in got["state"].values())
    torch.testing.assert_close(
        sum(t.sum() for t in got["state"].values()), sum(t.sum() for t in want["state"].values())
    )
