"""An elastic run launched for real: `accel launch --nnodes 1:2` on two loopback "nodes" (two
launchers, one process each, torchrun's c10d rendezvous, gloo) that loses a node and gets one
back.

Node B is taken away (SIGKILL to its launcher, torchrun and worker) at the checkpoint of step
2. Node A's worker fails on its next collective, its agent forms a rendezvous of one node,
and the new worker resumes from the newest complete checkpoint through `load_state_if_any()`:
model and optimizer whole, the data position resharded from 2 processes to 1. At the
checkpoint of step 6 a node joins again: A's agent stops its worker, both agents form a
rendezvous of two, and both workers resume from that checkpoint on 2 processes. The final
weights equal those of a run that changed its number of processes at those checkpoints on
purpose (2 processes to step 2, 1 to step 6, 2 to the end), forked by one process that
runs beside the elastic run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from accel_cli._command import free_port
from accel_testkit.launch import LAUNCHER_VARS, launch_command, worker_env

pytestmark = pytest.mark.serial  # timeouts: runs alone under pytest -n (conftest.py)

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_elastic_train.py"
TIMEOUT = 120
# The elastic run loses node B at the checkpoint of step SHRINK (2 processes) and gets a node
# back at the checkpoint of step GROW (1 process); the worker saves every 2 steps.
SHRINK, GROW = 2, 6
# Short rendezvous timeouts (seconds): a node whose heartbeat (sent every 1 to 2 s) is 6 s
# old is lost; once the fewest nodes are there, the rendezvous waits 3 s more for the others.
RDZV_CONF = (
    "join_timeout=60,last_call_timeout=3,close_timeout=5,keep_alive_interval=1,"
    "keep_alive_max_attempt=6"
)


def _env(config_home: Path) -> dict[str, str]:
    """The current environment without launcher or accel settings, and no user config file."""
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", *LAUNCHER_VARS]
    # LOGLEVEL: torchrun's agents log their rendezvous rounds (in the logs of a failure).
    return worker_env(drop=drop, XDG_CONFIG_HOME=str(config_home), LOGLEVEL="INFO")


def _tree(proc: subprocess.Popen) -> list[psutil.Process]:
    """The launcher and everything under it (torchrun's workers run in their own sessions)."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    return []


def _kill(proc: subprocess.Popen) -> None:
    """A node lost: SIGKILL to its launcher, torchrun and workers at once."""
    for p in _tree(proc):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _wait_for(what: str, ready, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not ready():
        for proc, log in zip(procs, logs):
            assert proc.poll() is None, (
                f"{what}: a launcher exited early:\n{log.read_text()[-3000:]}"
            )
        assert time.monotonic() < deadline, f"{what}: timed out"
        time.sleep(0.05)


def _starts(project: Path) -> list[dict]:
    out = []
    for path in (project / "starts").glob("*.json"):
        with contextlib.suppress(json.JSONDecodeError):  # being written
            out.append(json.loads(path.read_text()))
    return out


def _complete(project: Path, step: int) -> bool:
    """Whether the checkpoint of `step` is complete (the worker saves every 2 steps)."""
    return (
        project / "checkpoints" / f"checkpoint_{step // 2 - 1}" / "accel_checkpoint.json"
    ).exists()


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _finish(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=TIMEOUT) == 0, log.read_text()[-5000:]


def test_a_node_lost_then_back_resumes_resharded_and_matches_planned_changes(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path / "xdg")
    elastic, reference = tmp_path / "elastic", tmp_path / "reference"
    logs = {n: tmp_path / f"{n}.log" for n in ("a", "b", "b_again", "reference")}
    port = free_port()
    # A node that forms the first round alone (the other joined after the last call) waits
    # before training for the other one (--hold 1:0), which makes the agents start again.
    holds = ["--hold", "1:0", "--hold", f"2:{SHRINK}", "--hold", f"1:{GROW}"]
    script = [str(SCRIPT), str(elastic), *holds]

    def node(name: str, host: str) -> subprocess.Popen:
        # Node A hosts the rendezvous store (is_host), so that it outlives node B.
        conf = f"{RDZV_CONF},is_host={host}"
        argv = launch_command("--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_backend",
                              "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--max_restarts",
                              "3", "--monitor_interval", "0.2", "--rdzv_conf", conf, *script,
                              num_processes=None)  # fmt: skip
        return _start(argv, env, logs[name])

    procs: list[subprocess.Popen] = []
    try:
        parts = ["2:" + str(SHRINK), "1:" + str(GROW), "2:-1"]
        planned = [sys.executable, str(SCRIPT), str(reference), "--planned", *parts]
        procs.append(_start(planned, env, logs["reference"]))
        procs += [node("b", "0"), node("a", "1")]
        ref, node_b, node_a = procs
        _wait_for(f"the checkpoint of step {SHRINK}", lambda: _complete(elastic, SHRINK),
                  [node_a, node_b], [logs["a"], logs["b"]])  # fmt: skip
        on_two = [s for s in _starts(elastic) if s["world"] == 2]
        assert sorted(s["rank"] for s in on_two) == [0, 1], _starts(elastic)
        _kill(node_b)
        _wait_for(f"the checkpoint of step {GROW}", lambda: _complete(elastic, GROW),
                  [node_a], [logs["a"]])  # fmt: skip
        procs.append(node("b_again", "0"))
        _finish(node_a, logs["a"])
        _finish(procs[-1], logs["b_again"])
        _finish(ref, logs["reference"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill(proc)

    def resumes(project: Path) -> list[tuple[int, int, int]]:
        """(world, resumed step, rank) of each start that resumed, in order."""
        starts = sorted(_starts(project), key=lambda s: (s["step"], s["rank"]))
        return [(s["world"], s["step"], s["rank"]) for s in starts if s["resumed"]]

    planned_resumes = [(1, SHRINK, 0), (2, GROW, 0), (2, GROW, 1)]
    assert resumes(elastic) == planned_resumes, _starts(elastic)
    assert resumes(reference) == planned_resumes, _starts(reference)
    assert json.loads((elastic / "done.json").read_text())["world"] == 2
    expected = load_file(reference / "final" / "model.safetensors")
    got = load_file(elastic / "final" / "model.safetensors")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
