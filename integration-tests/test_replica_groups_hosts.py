"""Replica groups on separate hosts (tools/netns): test_replica_groups.py's kill-and-heal
scenario with each group on a network host of its own and the survivor's peer lost by a cut
link, not a kill.

The lighthouse and group 0 run on host 0, group 1 on host 1, each group its own one-process
`accel launch --ft_*` given the lighthouse at host 0's cluster address. Nothing tells gloo,
torchft's store or its checkpoint server which address to use (GLOO_* unset; the host name
resolves to 127.0.0.1, a one-process launch has a loopback store): the run only forms because
the fault-tolerant strategy advertises the address on the route to the lighthouse. Host 1's
link is cut mid-training: group 0 keeps committing steps alone, without a restart and without
a pause beyond the timeouts; host 1 comes back as a scheduler would bring it (its processes
killed, its link up, its group launched again), heals from group 0 over the cluster network
(its first step is group 0's, not 0), and at the end both hold the same state bit for bit.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from accel_testkit.launch import LAUNCHER_VARS, accel_command, launch_command, worker_env
from accel_testkit.netns import Hosts, hosts_or_skip

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import test_replica_groups as rg
finally:
    sys.path.remove(str(HERE))

pytestmark = [pytest.mark.needs("torchft", "accel"), pytest.mark.slow, pytest.mark.serial]

HEARTBEAT_TIMEOUT = 5  # seconds: the lighthouse drops a silent group (its default)
# seconds: a quorum, a collective, a commit (--ft_timeout). Above the heartbeat timeout: the
# first quorum after the cut waits for the lighthouse to drop host 1's group, and a quorum
# timeout equal to it lost that race once on a quiet machine (group 0 failed its quorum)
FT_TIMEOUT = 2 * HEARTBEAT_TIMEOUT
STEPS, PACE = 200, 0.1  # alone, a group sleeps 4 x PACE a step: time for host 1 to come back


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with hosts_or_skip(f"accelrg{os.getpid() % 100000}", 2) as made:
        yield made


def _env(tmp: Path) -> dict[str, str]:
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "TORCHFT_*", "GLOO_*", "NCCL_*"]
    return worker_env(drop=[*drop, *LAUNCHER_VARS], XDG_CONFIG_HOME=str(tmp / "xdg"))


@contextlib.contextmanager
def _lighthouse(hosts: Hosts, tmp: Path) -> Iterator[str]:
    """`accel lighthouse` on host 0's cluster address; yields the address it prints."""
    bind = f"{hosts.address(0)}:0"
    cmd = hosts.command(0, accel_command("lighthouse", "--min_replicas", 1, "--bind", bind))
    proc = subprocess.Popen(
        cmd, env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith(f"lighthouse at http://{hosts.address(0)}:"), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _group(hosts: Hosts, tmp: Path, address: str, group: int, out: Path) -> subprocess.Popen:
    """Replica group `group` on host `group`: a one-process `accel launch`, logged where
    test_replica_groups' helpers read it."""
    flags = [
        "--ft_replica_group_id", group, "--ft_num_replica_groups", 2,
        "--ft_min_replica_groups", 1, "--ft_lighthouse", address, "--ft_timeout", FT_TIMEOUT,
    ]  # fmt: skip
    cmd = hosts.command(group, launch_command(*flags, rg.SCRIPT, out, STEPS, PACE, num_processes=1))
    log = (out / f"launch_g{group}.txt").open("a")
    return subprocess.Popen(
        cmd, env=_env(tmp), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _alone(out: Path, since: int) -> int:
    """Steps that group 0 committed alone in its records from index `since` on."""
    lines = (out / "g0_r0.jsonl").read_text().splitlines()[since:]
    recs = [json.loads(line) for line in lines if line.endswith("}")]
    return sum(r["participants"] == 1 and not r["skipped"] for r in recs)


def test_a_cut_host_leaves_the_other_group_training_and_heals_when_back(
    hosts: Hosts, tmp_path: Path
) -> None:
    out = tmp_path / "cut"
    out.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        with _lighthouse(hosts, tmp_path) as address:
            survivor = _group(hosts, tmp_path, address, 0, out)
            procs.append(survivor)  # group 0 first: the run's step 0 is its own (no heal)
            rg._wait_for("group 0's first step", lambda: rg._count(out, 0) >= 1, procs, out)
            procs.append(_group(hosts, tmp_path, address, 1, out))
            both = lambda: rg._count(out, 1, skipped=False, participants=2) >= 5  # noqa: E731
            rg._wait_for("5 steps of both groups", both, procs, out)
            hosts.cut(1)
            cut_after = len(rg._records(out, 0))
            alone = lambda: _alone(out, since=cut_after) >= 5  # noqa: E731
            rg._wait_for("5 steps of group 0 alone after the cut", alone, [survivor], out)
            hosts.kill(1)  # what a scheduler does with a host that came back: a fresh start
            procs[1].wait(timeout=60)
            hosts.mend(1)
            lost_at, relaunched_at = len(rg._records(out, 1)), rg._records(out, 0)[-1]["step"]
            procs.append(_group(hosts, tmp_path, address, 1, out))
            rg._finish([survivor, procs[2]], out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
        hosts.kill(1)
        hosts.mend(1)
    first, second = rg._records(out, 0), rg._records(out, 1)
    # group 0: one run (no restart), every step committed once, some alone after the cut
    assert [r["step"] for r in first if not r["skipped"]] == list(range(STEPS))
    after_cut = first[cut_after:]
    assert _alone(out, since=cut_after) >= 5, after_cut
    # ... and no pause beyond the timeouts: the step in flight at the cut waits out its
    # collective and commit, the next quorum the lighthouse's heartbeat timeout; the rest is
    # room for a loaded machine (a restart would also show in the steps above)
    bound = 3 * FT_TIMEOUT + HEARTBEAT_TIMEOUT + 30
    gaps = [b["t1"] - a["t1"] for a, b in itertools.pairwise(first)]
    assert max(gaps) < bound, (max(gaps), bound)
    # group 1 relaunched: healed from group 0 over the cluster network, its first step
    # group 0's, not 0; behind at that quorum, it sits that step out (group 0 commits it
    # alone, and group 1 takes its average) and trains with group 0 from the next
    before, rejoined = second[:lost_at], second[lost_at:]
    assert rejoined[0]["step"] > relaunched_at > before[-1]["step"], (before[-1], rejoined[0])
    committed = {r["step"]: r["participants"] for r in first if not r["skipped"]}
    assert rejoined[0]["participants"] == committed[rejoined[0]["step"]] == 1, rejoined[0]
    assert committed[rejoined[0]["step"] + 1] == 2, rejoined[:2]
    assert [r["step"] for r in rejoined if not r["skipped"]][-1] == STEPS - 1
    # the end: the same weights, optimizer and scheduler state, bit for bit
    a, b = rg._final(out, 0), rg._final(out, 1)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for i, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            theirs = b["optimizer"]["state"][i][name]
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(theirs)), (i, name)
    assert a["scheduler"] == b["scheduler"]
