"""32 ranks for real on this machine (one thread each, gloo): on loopback, and as 8 namespaced
hosts x 4 processes (tools/netns).

- FSDP2 on loopback and DDP across the 8 hosts train, save mid-epoch, train on, and resume
  from that checkpoint (_scale_train.py): the resumed run's global batches and final weights
  equal the uninterrupted run's, bit for bit (the same world, the same order of operations).
- The preflight of 8 hosts names a machine rank given to two of them, before any worker starts.
- The hang doctor names the host that is lost (its link cut) and its 4 ranks.

Each phase's wall time (rank 0's and the slowest rank's) is printed; tools/bench/README.md's
"At scale" table sets them beside the simulation's figures at N = 32 (bench_scale.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from accel_testkit.launch import launch_command, worker_env
from accel_testkit.netns import Hosts, hosts_or_skip

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    from test_multihost import HANG_EXIT_CODE, PREFLIGHT_EXIT_CODE, Launches, _env, _flags
finally:
    sys.path.remove(str(HERE))

TRAIN = HERE / "_scale_train.py"
HOSTS, PER_HOST = 8, 4
WORLD = HOSTS * PER_HOST
# 32 processes importing torch on 2 cores take a minute before the first step
TIMEOUT = 420
# The hang doctor's timeout must outlast the slowest rank's start (its first step is timed
# from the Accelerator's creation, and 32 imports on 2 cores skew the starts by tens of seconds)
HANG_TIMEOUT = 30
pytestmark = [pytest.mark.slow]


def _check_resume(result: dict) -> None:
    assert result["world"] == WORLD
    full, resumed = result["full"], result["resumed"]
    assert sorted(resumed["batches"]) == [4, 5, 6, 7]
    for step, batch in resumed["batches"].items():
        assert batch == full["batches"][step], f"step {step}: the data position differs"
    # an epoch is 64 samples, a step 32: every epoch sees each sample once
    for first in (1, 3, 5):
        epoch = full["batches"][first] + full["batches"][first + 1]
        assert sorted(epoch) == list(range(64)), f"steps {first}-{first + 1}"
    for name, value in full["state"].items():
        assert torch.equal(value, resumed["state"][name]), f"{name}: the resumed run differs"
    print(f"\n{result['files']} files, .metadata {result['metadata_bytes']} bytes")
    for name, seconds in sorted(result["times_slowest"].items()):
        print(f"  {name:<22} rank 0 {result['times_rank0'][name]:7.3f} s, slowest {seconds:7.3f} s")


def test_32_processes_on_loopback_train_fsdp2_and_resume_exactly(tmp_path: Path) -> None:
    argv = launch_command(TRAIN, "fsdp2", tmp_path, num_processes=WORLD)
    log = tmp_path / "launch.log"
    with log.open("w") as out:
        code = subprocess.run(
            argv, env=worker_env(drop=["ACCEL_*"]), cwd=tmp_path, stdout=out,
            stderr=subprocess.STDOUT, timeout=TIMEOUT,
        ).returncode  # fmt: skip
    assert code == 0, log.read_text()[-4000:]
    result = torch.load(tmp_path / "result-fsdp2.pt")
    _check_resume(result)
    # FSDP2's DCP folders (model, optimizer) hold every rank's shards and one .metadata each
    assert result["metadata_bytes"] > 0


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with hosts_or_skip(f"acc32{os.getpid() % 100000}", HOSTS) as made:
        yield made


@pytest.mark.serial
def test_preflight_of_8_hosts_names_a_machine_rank_given_twice(
    hosts: Hosts, tmp_path: Path
) -> None:
    """Hosts 3 and 5 both say --machine_rank 3 (no host says 5): every launcher exits with the
    preflight's code, naming both, and no worker starts."""
    runs = Launches(tmp_path)
    env = _env(tmp_path)
    for host in [3, 5, *[h for h in range(HOSTS) if h not in (3, 5)]]:
        rank = 3 if host == 5 else host
        flags = _flags(hosts, rank, machines=HOSTS, processes=WORLD)
        runs.start(hosts, host, [*flags, TRAIN, "ddp", tmp_path], env)
    results = runs.wait(timeout=120)
    for code, log in results:
        assert code == PREFLIGHT_EXIT_CODE, log[-3000:]
        assert "machine_rank 3: claimed by 2 hosts" in log, log[-3000:]
        assert f"at {hosts.address(3)}" in log and f"at {hosts.address(5)}" in log, log[-3000:]
    assert not list(tmp_path.glob("result-*"))


@pytest.mark.serial
def test_8_hosts_of_4_train_ddp_resume_exactly_then_name_a_lost_host(
    hosts: Hosts, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    env = _env(tmp_path)
    runs = Launches(tmp_path)
    for host in range(HOSTS):
        flags = _flags(hosts, host, machines=HOSTS, processes=WORLD)
        flags += ["--hang_timeout", HANG_TIMEOUT]
        runs.start(hosts, host, [*flags, TRAIN, "ddp", tmp_path, "--hang", ready], env)
    lost = HOSTS - 1
    started = time.monotonic()
    verdict = diagnosed = None  # seconds from the launches' start, from the cut
    try:
        deadline = started + TIMEOUT
        while not ready.exists():
            assert runs.procs[0].poll() is None, runs.logs[0].read_text()[-4000:]
            assert time.monotonic() < deadline, "the ranks never met"
            if verdict is None and "preflight: ok" in runs.logs[0].read_text():
                verdict = time.monotonic() - started
            time.sleep(0.1)
        cut_at = time.monotonic()
        hosts.cut(lost)
        while runs.procs[0].poll() is None and time.monotonic() < cut_at + HANG_TIMEOUT + 120:
            if diagnosed is None and "accel hang doctor:" in runs.logs[0].read_text():
                diagnosed = time.monotonic() - cut_at
            time.sleep(0.1)
        code = runs.procs[0].wait(timeout=10)
        # the phases' wall times, for the README's "At scale" (a test asserts none)
        print(f"\npreflight verdict of 8 hosts: {verdict} s after the launches started")
        print(f"diagnosis printed {diagnosed} s after the cut (hang timeout {HANG_TIMEOUT} s)")
    finally:
        runs.kill()
        hosts.kill(lost)
        hosts.mend(lost)
    log = runs.logs[0].read_text()
    assert "preflight: ok: 8 host(s) agree" in log, log[-4000:]
    _check_resume(torch.load(tmp_path / "result-ddp.pt"))
    assert code == HANG_EXIT_CODE, log[-4000:]
    first, last = lost * PER_HOST, WORLD - 1
    named = rf"host {re.escape(hosts.address(lost))} \(ranks ({first}-{last}|{first}, .*{last})\) is lost"
    assert re.search(named, log), log[-4000:]
    # printed once, by the launcher, after the collecting rank probed the lost host
    assert log.count("accel hang doctor:") == 1, log[-4000:]
