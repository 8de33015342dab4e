"""save_state on N processes, load_state on M (DDP, gloo): 2 -> 1 and 1 -> 2.

Each run trains a few steps, saves, then trains on and records the global sample stream (the
sample indices of every global batch, gathered) and its weights. A resume on another number
of processes must load the very same model, optimizer, scheduler and registered state
(torch.equal), give each process that existed its RNG back, and continue the same global
sample stream when the global batch size is kept.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _models import RegressionData, assert_same_training, float32_error, loss_of, make_model

from accel import Accelerator
from accel.utils import set_seed
from accel_state.testing import run_distributed

GLOBAL_BATCH, BEFORE, AFTER = 8, 3, 3
# make_model(): 2 linear layers, reductions of at most 8 terms (8 features, 8 rows a global
# batch). SGD, linear in the gradient (see _models.py); momentum gives the optimizer a state
# that must come back for the training to go on the same.
STEP_ERROR = float32_error(layers=2, terms=8)


class Counter:
    """A registered object: its state must come back as saved."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def _setup(per_process_batch: int) -> tuple[Accelerator, Any, Any, Any, Any, Counter]:
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # It steps num_processes times per optimizer step (accelerate's convention), so a decay
    # within the test would differ between world sizes: its state must still come back.
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    loader = torch.utils.data.DataLoader(
        RegressionData(64), batch_size=per_process_batch, shuffle=True
    )
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    return accelerator, model, optimizer, loader, scheduler, counter


def _train(accelerator, model, optimizer, batches, scheduler, counter, steps: int) -> list:
    """`steps` optimizer steps on `batches` (an iterator over the prepared loader); the
    sample ids of each global batch."""
    stream = []
    for batch in batches:
        loss = loss_of(model, batch)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        counter.seen += 1
        stream.append(accelerator.gather(batch["index"]).tolist())
        if len(stream) == steps:
            break
    return stream


def _snapshot(accelerator, model, optimizer, scheduler, counter) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),  # the momentum changes in place
        "scheduler": scheduler.state_dict(),
        "counter": counter.state_dict(),
        "rng": torch.get_rng_state(),
    }


def _save_run(folder: str) -> dict[str, Any]:
    """Train BEFORE steps, save, record, train AFTER more steps (the reference)."""
    accelerator, model, optimizer, loader, scheduler, counter = _setup(GLOBAL_BATCH // _world())
    batches = iter(loader)  # one pass: the steps after the save go on where it stopped
    _train(accelerator, model, optimizer, batches, scheduler, counter, steps=BEFORE)
    accelerator.save_state(folder)
    saved = _snapshot(accelerator, model, optimizer, scheduler, counter)
    stream = _train(accelerator, model, optimizer, batches, scheduler, counter, steps=AFTER)
    final = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return {"saved": saved, "stream": stream, "final": final}


def _resume_run(folder: str, per_process_batch: int | None = None) -> dict[str, Any]:
    """Load the checkpoint, record what was loaded, and train AFTER steps."""
    objects = _setup(per_process_batch or GLOBAL_BATCH // _world())
    accelerator, model, optimizer, loader, scheduler, counter = objects
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.load_state(folder)
    loaded = _snapshot(accelerator, model, optimizer, scheduler, counter)
    stream = _train(accelerator, model, optimizer, iter(loader), scheduler, counter, AFTER)
    final = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return {
        "loaded": loaded,
        "stream": stream,
        "final": final,
        "warnings": [str(w.message) for w in caught if "load_state" in str(w.message)],
    }


def _world() -> int:
    from accel_state import PartialState

    return PartialState().num_processes


def _assert_equal(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _assert_loaded_as_saved(saved: dict, loaded: dict) -> None:
    for part in ("model", "optimizer", "scheduler", "counter"):
        _assert_equal(saved[part], loaded[part], part)


def _assert_same_training(reference: dict, resumed: dict) -> None:
    assert resumed["stream"] == reference["stream"]  # the same global sample stream
    # same math from the saved weights, summed in another order: float32 rounding only
    saved = reference["saved"]["model"]
    assert_same_training(resumed["final"], reference["final"], saved, AFTER * STEP_ERROR)


@pytest.fixture(scope="module")
def saved_on_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    folder = str(tmp_path_factory.mktemp("portable") / "by_two")
    return folder, run_distributed(_save_run, folder, world_size=2, timeout=180)


def test_two_processes_to_one(saved_on_two: tuple[str, list[dict]]) -> None:
    folder, ranks = saved_on_two
    _assert_equal(ranks[0]["saved"]["model"], ranks[1]["saved"]["model"])  # DDP: one copy
    resumed = _resume_run(folder)
    _assert_loaded_as_saved(ranks[0]["saved"], resumed["loaded"])
    assert torch.equal(resumed["loaded"]["rng"], ranks[0]["saved"]["rng"])  # process 0's RNG
    assert resumed["warnings"] == []  # same global batch: nothing approximate
    _assert_same_training(ranks[0], resumed)


def test_one_process_to_two(tmp_path: Path) -> None:
    folder = str(tmp_path / "by_one")
    reference = _save_run(folder)
    ranks = run_distributed(_resume_run, folder, world_size=2, timeout=180)
    for resumed in ranks:
        _assert_loaded_as_saved(reference["saved"], resumed["loaded"])
        _assert_same_training(reference, resumed)
    assert torch.equal(ranks[0]["loaded"]["rng"], reference["saved"]["rng"])
    assert ranks[0]["warnings"] == []
    (note,) = ranks[1]["warnings"]  # process 1 did not exist: it keeps its own RNG
    assert "process 1 did not exist" in note and "keeps its own random state" in note


def test_another_global_batch_size_says_what_is_approximate(
    saved_on_two: tuple[str, list[dict]],
) -> None:
    folder, ranks = saved_on_two
    resumed = _resume_run(folder, per_process_batch=2 * GLOBAL_BATCH)
    _assert_loaded_as_saved(ranks[0]["saved"], resumed["loaded"])
    (note,) = resumed["warnings"]
    # 3 batches of 8 = 24 samples; batches of 16 resume after 16: 8 samples are seen again.
    assert "3 batches of 8 samples" in note and "continues at batch 1" in note
    assert "8 samples of the epoch are seen again" in note
    after_save = [i for batch in ranks[0]["stream"] for i in batch]  # samples 24..47
    first = resumed["stream"][0]  # samples 16..31 of the same epoch order
    assert set(first[:8]).isdisjoint(after_save)  # 16..23 were seen before the save
    assert first[8:] == after_save[:8]
    assert resumed["stream"][1] == after_save[8:24]
