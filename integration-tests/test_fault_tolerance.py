"""Training that survives, launched for real (`accel launch --cpu`, two gloo processes).

- A worker killed mid-run restarts under `--max_restarts 1`, resumes by itself from the
  newest checkpoint, and ends with the weights of a run that never failed.
- SIGTERM to the launcher: both workers see the stop at the same step, save, return; the
  launcher exits with STOPPED_EXIT_CODE and leaves no worker behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from accel_cli._run import STOPPED_EXIT_CODE
from accel_testkit.launch import LAUNCHER_VARS, launch_command, worker_env

pytestmark = pytest.mark.serial  # timeouts: runs alone under pytest -n (conftest.py)

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_resumable_train.py"
TIMEOUT = 300


def _env(config_home: Path) -> dict[str, str]:
    """The current environment without launcher or accel settings, and no user config file."""
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", *LAUNCHER_VARS]
    return worker_env(drop=drop, XDG_CONFIG_HOME=str(config_home))


def test_a_killed_worker_restarts_resumes_and_matches_an_unbroken_run(tmp_path: Path) -> None:
    env = _env(tmp_path / "xdg")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run = subprocess.run(
        launch_command(SCRIPT, whole), env=env, capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    # Rank 1 dies after micro-step 7; the newest checkpoint then is the one of step 6.
    run = subprocess.run(
        launch_command("--max_restarts", "1", SCRIPT, broken, "--die_rank", "1", "--die_at", "7"),
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        assert json.loads((broken / f"resumed_0_{rank}").read_text()) == [None, 0]
        where, step = json.loads((broken / f"resumed_1_{rank}").read_text())
        assert where.endswith("checkpoint_1") and step == 6
    expected = load_file(whole / "final" / "model.safetensors")
    got = load_file(broken / "final" / "model.safetensors")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


def test_sigterm_stops_every_worker_at_one_step_with_a_checkpoint(tmp_path: Path) -> None:
    project = tmp_path / "run"
    project.mkdir()
    proc = subprocess.Popen(
        launch_command(SCRIPT, project, "--until_stopped"),
        env=_env(tmp_path / "xdg"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (project / "ready").exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the workers never started training"
            time.sleep(0.1)
        workers = [int((project / f"pid_0_{r}").read_text()) for r in (0, 1)]
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=TIMEOUT)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == STOPPED_EXIT_CODE, output[-3000:]
    steps = {(project / f"stopped_{r}").read_text() for r in (0, 1)}
    assert len(steps) == 1, steps  # both ranks stopped at the same step
    newest = max((project / "checkpoints").glob("checkpoint_*"), key=lambda p: int(p.name[11:]))
    saved = torch.load(newest / "custom_checkpoint_0.pkl", weights_only=True)
    assert str(saved["step"]) == steps.pop()
    alive = [pid for pid in workers if psutil.pid_exists(pid)]
    alive = [p for p in alive if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"workers left running: {alive}"
