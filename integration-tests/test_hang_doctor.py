"""The hang doctor under `accel launch --hang_timeout`, with two real gloo processes: each
scenario of `_hang_train.py` ends with one diagnosis naming the rank, the collective and the
file:line, and with HANG_EXIT_CODE, within about twice the timeout after the hang (the
subprocess timeout guards the test against a real hang)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from accel_state.hang import DIAGNOSIS_FILE, HANG_EXIT_CODE, REPORT_DIR_NAME
from accel_testkit.launch import LAUNCHER_VARS, launch_command, worker_env

pytestmark = pytest.mark.serial  # timeouts: runs alone under pytest -n (conftest.py)

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_hang_train.py"
# Above a loaded machine's first step: DDP's first forward and backward once took over 3 s on
# 2 cores shared with other tests' processes, and a slow healthy step is a step over the timeout
HANG_TIMEOUT = 6
# process start and torch import (twice: workers, then the launcher's diagnosis), plus the
# hang itself: the timeout and the grace the ranks give each other's reports
GUARD = 90


def _launch(scenario: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    env = worker_env(drop=["ACCEL_*", "TORCHELASTIC_*", *LAUNCHER_VARS])
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    project = tmp_path / scenario
    cmd = launch_command("--hang_timeout", HANG_TIMEOUT, SCRIPT, scenario, project)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=GUARD)
    return run, project / REPORT_DIR_NAME


def _headline(run: subprocess.CompletedProcess) -> str:
    lines = [line for line in run.stderr.splitlines() if line.startswith("accel hang doctor:")]
    assert len(lines) == 1, run.stderr[-3000:]  # one diagnosis, printed by the launcher
    return lines[0]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (
            "different",
            "rank 1 is in gather #3 (_hang_train.py:51) while rank 0 is in reduce #3 "
            "(_hang_train.py:49)",
        ),
        ("skip", "rank 1 never reached collective #4: it is in the backward pass at "),
        (
            "loader",
            "rank 1 never reached the next collective: it is in the data loader at "
            "_hang_train.py:30",
        ),
        (
            "killed",
            "rank 1 wrote no report (the process died or was killed) while rank 0 failed in "
            "gather #3 (_hang_train.py:55)",
        ),
    ],
)
def test_launch_diagnoses_the_hang_and_exits_with_the_hang_code(
    scenario: str, expected: str, tmp_path: Path
) -> None:
    run, folder = _launch(scenario, tmp_path)
    assert run.returncode == HANG_EXIT_CODE, run.stderr[-3000:]
    headline = _headline(run)
    assert expected in headline, headline
    assert (folder / DIAGNOSIS_FILE).read_text().splitlines()[0] == headline
    ranks = [0] if scenario == "killed" else [0, 1]
    for rank in ranks:
        report = json.loads((folder / f"rank{rank}.json").read_text())
        assert report["rank"] == rank and report["world_size"] == 2
        assert "skipped: no CUDA" in report["nccl_trace"] or "not NCCL" in report["nccl_trace"]
        stack = (folder / f"rank{rank}.stack.txt").read_text()
        assert "_hang_train.py" in stack  # faulthandler's dump of every thread
    if scenario == "skip":
        assert "rank 0 is in gather #4 (_hang_train.py:55)" in headline
