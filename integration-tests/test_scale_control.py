"""The control plane's scale figures at small N, as exact counts: the simulation of
tools/bench/_scale_control.py (accel's real preflight and hang doctor, the other machines
and ranks on loopback) at N = 8 to 64, asserting what makes the costs grow as they should.

- preflight: the answer each machine gets has the same size at any N, but for the digits of
  N itself; machine 0's report names four hosts and a count.
- preflight with a rank given twice: every machine's answer names it.
- hang doctor, one host's ranks lost: the collecting rank makes two store round trips (a
  check and a multi_get of the lost ranks' keys) and one probe; the other ranks read nothing
  from the store; the collector opens N files and a constant number more; the headline
  names the ranks as ranges, and what is printed has a bound.

The full sweep to 16,384 is `uv run python tools/bench/bench_scale.py` (not a test).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from accel_cli._preflight import host_label
from accel_state._diagnosis import BRIEF_LINES
from accel_state.hosts import _PROBE_PORT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))
try:
    import _scale_control as scale
finally:
    sys.path.pop(0)


def _answer_size(n: int) -> int:
    world = scale.preflight_world(n)
    assert not world["outcome"].fatal, world["outcome"].problems
    assert world["answered"] == n - 1 and not world["errors"], world["errors"]
    (size,) = set(world["answer_bytes"])  # every machine gets the same answer
    (line,) = world["printed"][-1:]
    shown = ", ".join(host_label(f) for f in world["outcome"].hosts)
    assert line == f"ok: {n} host(s) agree ({shown} and {n - 4} more); talking over lo"
    return size


def test_each_machine_gets_an_answer_of_one_size_at_any_number_of_machines() -> None:
    # The answer holds the count and the first four hosts' facts, whose num_processes and
    # num_machines are N: N is written 9 times, the only bytes that change with N.
    assert _answer_size(64) - _answer_size(8) == 9 * (len("64") - len("8"))


def test_a_rank_given_twice_is_named_to_every_machine() -> None:
    world = scale.preflight_world(64, duplicate=True)
    named = '"machine_rank 62", "message": "claimed by 2 hosts (node62 at 127.0.0.64, node63'
    answers = [r.answer.decode() for r in world["results"] if r.answer]
    assert answers and all(named in a for a in answers), answers[:1]


def _can_bind_the_probe_port() -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.255.255.254", _PROBE_PORT))
        except PermissionError:
            return False
    return True


@pytest.mark.skipif(
    not _can_bind_the_probe_port(),
    reason=f"a silent host on loopback listens on the probe's port {_PROBE_PORT}: root only",
)
def test_a_lost_host_costs_two_store_round_trips_and_one_probe(tmp_path: Path) -> None:
    opened = {}
    for n, survivors in ((16, "ranks 0-7"), (64, "ranks 0-23, 32-63")):
        folder = tmp_path / str(n)
        folder.mkdir()
        world = scale.hang_world(n, folder)
        lost = world["lost"]
        rank0, rank1 = world["stores"][0], world["stores"][1]
        assert dict(rank0.ops) == {"set": 1, "check": 1, "multi_get": 1}  # set: the notice
        assert rank0.keys_read == 2 * len(lost)
        assert rank1.reads == 0 and rank1.ops["set"] == 0
        assert world["probes"] == {"rank0": 1}
        first, last = lost[0], lost[-1]
        assert world["diagnosis"].splitlines()[0] == (
            f"accel hang doctor: host {world['silent']} (ranks {first}-{last}) is lost: it does "
            f"not answer on the network (its link or the machine is down) while {survivors} "
            f"are in allreduce #57 (train.py:88)"
        )
        assert len(world["diagnosis"].splitlines()) == n + 1  # the file: a line per rank
        printed = world["printed"].splitlines()
        assert len(printed) <= BRIEF_LINES + 3, printed  # headline, lines, "more", folder
        opened[n] = world["opened"]["rank0"] - n
        assert world["opened"]["rank1"] == 2  # its stack and its report: none of the others
    assert opened[16] == opened[64]  # the collector opens the N reports and a constant more
