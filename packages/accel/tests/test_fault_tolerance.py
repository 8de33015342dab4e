"""Training that survives, in-process parts: load_state_if_any, should_stop agreed across
ranks, and find_executable_batch_size retrying together (real gloo processes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from accel import Accelerator, ProjectConfiguration, find_executable_batch_size
from accel_state.testing import run_distributed


def _accelerator(project: Path) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    acc = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model, opt = acc.prepare(nn.Linear(3, 2), torch.optim.SGD(nn.Linear(3, 2).parameters(), 0.1))
    return acc, model, opt


def test_load_state_if_any_starts_fresh_then_resumes_the_newest(tmp_path: Path) -> None:
    acc, model, _ = _accelerator(tmp_path)
    assert acc.load_state_if_any() is None
    acc.save_state()
    with torch.no_grad():
        model.weight.add_(1.0)
    acc.save_state()
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    assert acc.load_state_if_any().endswith("checkpoint_1")
    assert torch.equal(model.weight, saved)
    assert acc.save_state().endswith("checkpoint_2")  # numbering continues
    plain = Accelerator(cpu=True, project_dir=str(tmp_path))
    with pytest.raises(ValueError, match="automatic_checkpoint_naming"):
        plain.load_state_if_any()


def _stop_at_one_step() -> list[bool]:
    """Rank 1 gets SIGUSR1 during step 2; every rank must answer True from step 2 on."""
    acc = Accelerator(cpu=True)
    answers = []
    for step in range(4):
        if step == 2 and acc.process_index == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        answers.append(acc.should_stop())
    return answers


def _agreed_batch_size() -> list[int]:
    """Only rank 1 runs out of memory at batch size 8; both must retry at 4, and stop there."""
    from accel_state import PartialState

    rank = PartialState(cpu=True).process_index
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=8, reduce_factor=0.5)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        if rank == 1 and batch_size == 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    total = torch.tensor([train()])
    torch.distributed.all_reduce(total)  # the ranks go on together
    assert total.item() == 8  # 4 + 4
    return tried


def _both() -> dict:
    return {"stop": _stop_at_one_step(), "batch": _agreed_batch_size()}


def test_stop_request_and_batch_size_search_agree_across_ranks() -> None:
    results = run_distributed(_both, world_size=2, timeout=120)
    for result in results:
        assert result["stop"] == [False, False, True, True]
        assert result["batch"] == [8, 4]


_REPEATED_STOP = """
import os, signal, sys
from accel import Accelerator

acc = Accelerator(cpu=True)
assert not acc.should_stop()  # installs the handlers
os.kill(os.getpid(), signal.SIGTERM)
assert acc.should_stop()
assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM)
os.kill(os.getpid(), signal.SIGTERM)  # the same stop again, as SLURM + a launcher send it
print("saved and returned", flush=True)
"""


def test_a_repeated_stop_signal_after_the_stop_is_agreed_does_not_kill_the_process() -> None:
    """A second SIGTERM after the run agreed to stop (and while it saves or exits) is ignored,
    so the process exits 0 instead of dying by the signal after it saved."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _REPEATED_STOP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "saved and returned" in done.stdout


_STOP_UNDER_THE_HANG_DOCTOR = """
import os, signal
from accel import Accelerator

acc = Accelerator(cpu=True, hang_timeout=60)
assert acc._hang_doctor is not None
assert not acc.should_stop()  # replaces the doctor's SIGTERM handler (the default's stand-in)
os.kill(os.getpid(), signal.SIGTERM)
assert acc.should_stop()
acc.end_training()
print("stopped on request", flush=True)
"""


def test_should_stop_takes_sigterm_over_from_the_hang_doctor() -> None:
    """The hang doctor holds SIGTERM's default during collectives; a loop that asks
    `should_stop()` still gets its stop request instead of the end of the process."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _STOP_UNDER_THE_HANG_DOCTOR],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "stopped on request" in done.stdout
