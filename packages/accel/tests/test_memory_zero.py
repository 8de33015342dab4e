"""ZeRO-1/2/3 estimates (accel_parallel.memory: the traced plain step with DeepSpeed's stage
rules) against the peak DeepSpeed reaches through the Accelerator on 2 gloo processes,
measured by accel_testkit.memory.measured_peak. Bound: 10% of the measured peak (the
estimate's bound). For this small model DeepSpeed's whole 5e8-element reduce bucket (2 GB in
float32) dominates the peak, so this checks mostly that bucket; the rest of the rule is
looser (see the package notes)."""

from __future__ import annotations

import functools
import importlib.util
import sys

import pytest
import torch

from accel_testkit.extensions import torch_extensions_dir
from accel_testkit.memory import measured_peak
from accel_testkit.models import Stack

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install accel-parallel[deepspeed])",
)

MLP = functools.partial(Stack, width=256, depth=4, hidden=1024, in_features=256, out_features=256)
BATCH = 256
BUCKET = 500_000_000 * 4  # DeepSpeed's default reduce bucket, float32


def _zero_peak(stage: int) -> int:
    from accel import Accelerator
    from accel.state import AcceleratorState
    from accel.utils import DeepSpeedPlugin

    AcceleratorState._reset_state(reset_partial_state=False)
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))

    def build() -> tuple:
        torch.manual_seed(0)
        with acc.deepspeed_plugin.zero3_init():
            net = MLP()
        data = torch.utils.data.TensorDataset(torch.randn(2 * BATCH, 256))
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH)  # DeepSpeed's "auto" batch
        model, opt, loader = acc.prepare(net, torch.optim.AdamW(net.parameters()), loader)
        return model, opt, next(iter(loader))[0]

    def steps(state: tuple) -> None:
        model, opt, x = state
        for _ in range(2):
            acc.backward(model(x).float().mean())
            opt.step()
            opt.zero_grad()

    return measured_peak(build, steps)


def _zero_peaks() -> dict[int, int]:
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # DeepSpeed's unused import
    from accel_state import PartialState

    PartialState(cpu=True)
    return {stage: _zero_peak(stage) for stage in (1, 2, 3)}


def test_zero_estimates_match_deepspeed_on_two_processes() -> None:
    from accel_parallel.memory import estimate_training_memory
    from accel_state.testing import run_distributed

    rows = estimate_training_memory(
        MLP, world_size=2, batch=[torch.randn(BATCH, 256)],
        engines=["zero1", "zero2", "zero3"], offload=[False],
    )  # fmt: skip
    predicted = {int(r.engine[-1]): r.peak_bytes for r in rows}
    ranks = run_distributed(
        _zero_peaks, world_size=2, timeout=600, env={"TORCH_EXTENSIONS_DIR": torch_extensions_dir()}
    )
    for rank, measured in enumerate(ranks):
        for stage, peak in measured.items():
            case = (rank, stage, predicted[stage], peak)
            assert peak > BUCKET, case  # the bucket is there, allocated whole
            assert abs(predicted[stage] - peak) <= 0.10 * peak, case
