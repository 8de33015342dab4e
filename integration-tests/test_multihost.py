"""Several machines for real: every host is a network namespace of its own (tools/netns), with
its own loopback, a dead first interface (eth0) and the cluster network (eth1), and runs its
own `accel launch --num_machines N --machine_rank i --main_process_ip <host 0>`.

What loopback hides is real here: the machine's host name resolves to 127.0.0.1, so gloo left
to itself advertises loopback to the other hosts; the first interface reaches nobody. The
launches train DDP, FSDP2 and DeepSpeed ZeRO-2 equal to one process of plain PyTorch; the
preflight names each planted mistake before any worker starts; a host whose link is cut
mid-collective is named by the hang doctor of the survivors.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from accel_testkit.launch import LAUNCHER_VARS, accel_command, worker_env
from accel_testkit.netns import Hosts, make_hosts
from accel_testkit.tolerance import assert_same_training, float32_error, norm_terms

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "_multihost_train.py"
HANG = HERE / "_multihost_hang.py"
PORT = 29500
TIMEOUT = 180
PREFLIGHT_EXIT_CODE = 78  # accel_cli._preflight.PREFLIGHT_EXIT_CODE
HANG_EXIT_CODE = 86
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    made = make_hosts(f"accel{os.getpid() % 100000}", 3)
    if isinstance(made, str):
        pytest.skip(made)
    try:
        yield made
    finally:
        made.remove()


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "GLOO_*", "NCCL_*", *LAUNCHER_VARS]
    return worker_env(drop=drop, XDG_CONFIG_HOME=str(tmp / "xdg"), **extra)


def _flags(hosts: Hosts, rank: int, machines: int = 2, processes: int = 2) -> list[object]:
    return [
        "--cpu", "--num_processes", processes, "--num_machines", machines,
        "--machine_rank", rank, "--main_process_ip", hosts.address(0),
        "--main_process_port", PORT,
    ]  # fmt: skip


class Launches:
    """`accel launch` started on several hosts at once; each one's output in its own log."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs, self.logs = tmp, [], []

    def start(self, hosts: Hosts, host: int, args: Sequence[object], env: dict[str, str]) -> None:
        log = self.tmp / f"host{host}.{len(self.logs)}.log"
        argv = hosts.command(host, accel_command("launch", *args))
        with log.open("w") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.logs.append(log)

    def wait(self, timeout: float = TIMEOUT) -> list[tuple[int, str]]:
        deadline = time.monotonic() + timeout
        out = []
        try:
            for proc, log in zip(self.procs, self.logs):
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                out.append((code, log.read_text()))
        finally:
            self.kill()
        return out

    def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _all_ok(results: list[tuple[int, str]]) -> None:
    for code, log in results:
        assert code == 0, log[-4000:]


# -- training across hosts ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("engine", "rdzv"), [("ddp", "static"), ("fsdp2", "c10d"), ("zero2", "static")]
)
def test_two_hosts_train_equal_to_one_process(
    hosts: Hosts, tmp_path: Path, engine: str, rdzv: str
) -> None:
    """2 hosts x 1 process; gloo is left to pick its interface by accel alone (GLOO_*
    unset), so the run only forms when accel chooses eth1, the route to host 0."""
    sys.path.insert(0, str(HERE))
    try:
        import _multihost_train as train
    finally:
        sys.path.remove(str(HERE))
    out = tmp_path / "state.pt"
    env = _env(tmp_path)
    runs = Launches(tmp_path)
    for rank in (0, 1):
        flags = _flags(hosts, rank)
        if rdzv != "static":
            flags += ["--rdzv_backend", rdzv]
        runs.start(hosts, rank, [*flags, TRAIN, engine, out], env)
    results = runs.wait()
    _all_ok(results)
    assert "preflight: ok: 2 host(s) agree" in results[0][1], results[0][1][-3000:]
    saved = torch.load(out)
    assert saved["world"] == 2 and saved["gloo"] == "eth1"
    net = train.make_net()
    params = [p for p in net.parameters()]
    # a step's gradients over 16 samples through 3 layers of <= 16 terms, the clip's norm
    error = float32_error(3, train.GLOBAL_BATCH, norm_terms(params))
    assert_same_training(
        saved["state"], train.reference(), net.state_dict(), bound=train.STEPS * error
    )
