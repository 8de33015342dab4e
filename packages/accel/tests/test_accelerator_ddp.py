"""The Accelerator on 2 real gloo processes: DDP equals one process on the same global batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from _models import RegressionData, assert_same_training, float32_error, loss_of, make_model

from accel import Accelerator
from accel_state.testing import run_distributed

STEPS = 7  # of 8 global batches: the loop does not end at the dataloader's end
PER_PROCESS = 4
# make_model(): 2 linear layers, reductions of at most 8 terms (8 features, 8 rows a global
# batch); SGD, linear in the gradient: the weights of 2 processes and of 1 differ by the
# rounding of their sums, at most STEP_ERROR of each step's movement (see _models.py).
STEP_ERROR = float32_error(layers=2, terms=8)


def _train(accelerator: Accelerator, batch_size: int, steps: int, accumulation: int = 1) -> dict:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # a constant schedule: the weights compare across world sizes, the step count is checked
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loader = DataLoader(RegressionData(), batch_size=batch_size, shuffle=False)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    seen = []
    for step, batch in enumerate(loader):
        if step >= steps:
            break
        with accelerator.accumulate(model):
            loss = loss_of(model, batch)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        seen.extend(batch["index"].tolist())
    weights = {k: v.detach().clone() for k, v in accelerator.get_state_dict(model).items()}
    return {"weights": weights, "seen": seen, "scheduler_steps": scheduler.last_epoch}


def _count_allreduces(state: list, bucket):  # a DDP comm hook that counts its calls
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    state[0] += 1
    return allreduce_hook(None, bucket)


def _ddp_worker() -> dict:
    out: dict = {}
    accelerator = Accelerator(cpu=True)
    out["ddp"] = _train(accelerator, PER_PROCESS, STEPS)
    out["type"] = str(accelerator.distributed_type)
    out["wrapped"] = type(accelerator._models[0]).__name__

    # accumulation under DDP: count the all-reduces of each micro-step
    accelerator.gradient_accumulation_steps = 2
    model = make_model(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    calls = [0]
    model.register_comm_hook(calls, _count_allreduces)
    per_step = []
    data = RegressionData(16)
    for micro in range(4):
        before = calls[0]
        rows = slice(
            micro * 4 + accelerator.process_index * 2, micro * 4 + accelerator.process_index * 2 + 2
        )
        with accelerator.accumulate(model):
            accelerator.backward(loss_of(model, {"x": data.x[rows], "y": data.y[rows]}))
            optimizer.step()
            optimizer.zero_grad()
        per_step.append((calls[0] - before, accelerator.sync_gradients))
    out["allreduces"] = per_step
    # inside no_sync, trigger_sync_in_backward still all-reduces that backward
    before = calls[0]
    with accelerator.no_sync(model), accelerator.trigger_sync_in_backward(model):
        accelerator.backward(loss_of(model, {"x": data.x[:2], "y": data.y[:2]}))
    out["triggered_allreduces"] = calls[0] - before
    optimizer.zero_grad()
    out["accum_weights"] = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}

    # gather_for_metrics over datasets whose length does not divide
    for length in (13, 7):
        loader = accelerator.prepare(DataLoader(RegressionData(length), batch_size=4))
        gathered = []
        for batch in loader:
            gathered.extend(accelerator.gather_for_metrics(batch["index"]).tolist())
        out[f"metrics_{length}"] = gathered
        objects = []
        for batch in loader:
            objects.extend(
                accelerator.gather_for_metrics([f"s{i}" for i in batch["index"].tolist()])
            )
        out[f"objects_{length}"] = objects
    # triggers: set on one rank, seen on all
    if accelerator.process_index == 1:
        accelerator.set_trigger()
    out["trigger"] = accelerator.check_trigger()
    out["trigger_again"] = accelerator.check_trigger()
    return out


@pytest.fixture(scope="module")
def ddp_results() -> list[dict]:
    """One 2-process run serves every test of this module (each spawn costs seconds)."""
    return run_distributed(_ddp_worker, world_size=2, timeout=180)


def test_ddp_two_processes_equal_one_process_on_the_global_batch(ddp_results: list[dict]) -> None:
    results = ddp_results
    reference = _train(Accelerator(cpu=True), 2 * PER_PROCESS, STEPS)
    for out in results:
        assert out["type"] == "MULTI_CPU" and out["wrapped"] == "DistributedDataParallel"
        # same global batches, gradients averaged by the all-reduce: float32 rounding only
        start = make_model().state_dict()
        assert_same_training(out["ddp"]["weights"], reference["weights"], start, STEPS * STEP_ERROR)
        # the scheduler stepped the familiar number of times: num_processes per optimizer step
        assert out["ddp"]["scheduler_steps"] == 2 * STEPS
    assert reference["scheduler_steps"] == STEPS
    # the two ranks saw disjoint halves of the same global batches
    seen = sorted(results[0]["ddp"]["seen"] + results[1]["ddp"]["seen"])
    assert seen == sorted(reference["seen"])


def test_ddp_accumulation_skips_allreduce_on_non_sync_steps(ddp_results: list[dict]) -> None:
    results = ddp_results
    for out in results:
        counts = [c for c, _ in out["allreduces"]]
        syncs = [s for _, s in out["allreduces"]]
        assert syncs == [False, True, False, True]
        assert counts[0] == 0 and counts[2] == 0, counts
        assert counts[1] >= 1 and counts[3] >= 1, counts
        assert out["triggered_allreduces"] >= 1
    # 2 processes x 2 micro-batches of 2 == one process, one step on the batch of 8
    acc = Accelerator(cpu=True)
    model = make_model(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    data = RegressionData(16)
    for step in range(2):
        rows = slice(step * 8, step * 8 + 8)
        loss_of(model, {"x": data.x[rows], "y": data.y[rows]}).backward()
        optimizer.step()
        optimizer.zero_grad()
    start = make_model(1).state_dict()
    bound = 2 * STEP_ERROR  # 2 steps
    assert_same_training(results[0]["accum_weights"], acc.get_state_dict(model), start, bound)


def test_gather_for_metrics_returns_each_sample_once(ddp_results: list[dict]) -> None:
    for out in ddp_results:
        for length in (13, 7):
            assert sorted(out[f"metrics_{length}"]) == list(range(length))
            assert sorted(out[f"objects_{length}"]) == sorted(f"s{i}" for i in range(length))
        assert out["trigger"] is True and out["trigger_again"] is False
