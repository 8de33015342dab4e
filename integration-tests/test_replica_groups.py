"""Fault tolerance across replica groups (torchft), launched for real: the lighthouse by
`accel lighthouse`, each replica group by its own `accel launch --ft_*` (gloo on loopback).

- No failure: 2 groups of 2 processes and 3 groups of 1 equal plain DDP over the same global
  batch at every step (float32 bound), and every group holds the same weights bit for bit.
- One group SIGKILLed mid-run: the other keeps committing steps alone (no restart); the
  relaunched group heals from it (its first step is the peer's, not 0); at the end both hold
  the same weights, optimizer and scheduler state bit for bit; the lost group's samples of the
  steps it missed are dropped, not read by the survivor.
- DiLoCo with 2 groups: the outer step equals a hand computation of Nesterov SGD on the
  averaged pseudo-gradient; with one group SIGKILLed after a sync, the other syncs on alone
  to the end.
- Bad configurations fail with a clear error within the connect timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_testkit.launch import LAUNCHER_VARS, accel_command, launch_command, worker_env
from accel_testkit.tolerance import assert_same_training, float32_error

pytestmark = [pytest.mark.needs("torchft", "accel"), pytest.mark.slow, pytest.mark.serial]

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "_ft_train.py"
TIMEOUT = 240


def _env(tmp: Path) -> dict[str, str]:
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "TORCHFT_*", *LAUNCHER_VARS]
    return worker_env(drop=drop, XDG_CONFIG_HOME=str(tmp / "xdg"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _lighthouse(tmp: Path, min_replicas: int) -> Iterator[str]:
    """`accel lighthouse` on loopback; yields the address its one line prints."""
    cmd = accel_command("lighthouse", "--min_replicas", min_replicas, "--bind", "127.0.0.1:0")
    proc = subprocess.Popen(
        cmd, env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("lighthouse at http://127.0.0.1:"), line
        yield line.split()[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _group(
    tmp: Path, address: str, group: int, groups: int, out: Path, steps: int, *,
    processes: int = 1, pace: float = 0.0, extra: tuple[object, ...] = (), minimum: int = 1,
) -> subprocess.Popen:  # fmt: skip
    """One replica group: its own `accel launch` (and session, to kill it whole)."""
    flags = [
        "--main_process_port", _free_port(), "--ft_replica_group_id", group,
        "--ft_num_replica_groups", groups, "--ft_min_replica_groups", minimum,
        "--ft_lighthouse", address, "--ft_timeout", 10, *extra,
    ]  # fmt: skip
    cmd = launch_command(*flags, SCRIPT, out, steps, pace, num_processes=processes)
    log = (out / f"launch_g{group}.txt").open("a")
    return subprocess.Popen(
        cmd, env=_env(tmp), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _finish(procs: list[subprocess.Popen], out: Path) -> None:
    for i, proc in enumerate(procs):
        try:
            rc = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = "timeout"
        logs = "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("launch_g*.txt")))
        assert rc == 0, f"group launch {i}: {rc}\n{logs}"


def _records(out: Path, group: int, rank: int = 0) -> list[dict]:
    lines = (out / f"g{group}_r{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _final(out: Path, group: int, rank: int = 0) -> dict:
    return torch.load(out / f"g{group}_r{rank}_final.pt", weights_only=False)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _samples(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[ids], y[ids]


def _ddp_reference(steps_ids: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """Plain DDP over the same global batch, as its arithmetic is: the mean of the ranks'
    mean losses (equal local batches) = one mean over the global batch, then the step."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = []
    for ids in steps_ids:
        x, y = _samples(ids)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        out.append({k: v.clone() for k, v in model.state_dict().items()})
    return out


def _equal_to_ddp(tmp: Path, groups: int, processes: int, steps: int) -> None:
    out = tmp / f"g{groups}x{processes}"
    out.mkdir()
    with _lighthouse(tmp, groups) as address:
        procs = [
            _group(tmp, address, g, groups, out, steps, processes=processes, minimum=groups)
            for g in range(groups)
        ]
        _finish(procs, out)
    ranks = [(g, r) for g in range(groups) for r in range(processes)]
    records = {gr: _records(out, *gr) for gr in ranks}
    for gr, recs in records.items():  # one quorum, one commit per step, all groups in each
        assert [r["step"] for r in recs] == list(range(steps)), gr
        assert all(not r["skipped"] and r["participants"] == groups for r in recs), gr
    steps_ids = [sum((records[gr][s]["ids"] for gr in ranks), []) for s in range(steps)]
    assert len({i for ids in steps_ids for i in ids}) == steps * len(ranks) * 2  # disjoint
    reference = _ddp_reference(steps_ids)
    finals = {gr: _final(out, *gr) for gr in ranks}
    start = finals[(0, 0)]["start"]
    # each step's gradient: 2 layers, reductions of at most 16 terms (width, global batch)
    error = float32_error(layers=2, terms=max(16, 2 * len(ranks)))
    for s in range(steps):
        got = finals[(0, 0)]["trajectory"][s]
        assert_same_training(got, reference[s], start, bound=(s + 1) * error)
    for gr, final in finals.items():  # every group and rank: the same weights, bit for bit
        for key, value in final["model"].items():
            assert torch.equal(value, finals[(0, 0)]["model"][key]), (gr, key)


def test_two_groups_of_two_processes_equal_plain_ddp(tmp_path: Path) -> None:
    _equal_to_ddp(tmp_path, groups=2, processes=2, steps=6)


def test_three_groups_equal_plain_ddp(tmp_path: Path) -> None:
    _equal_to_ddp(tmp_path, groups=3, processes=1, steps=6)


def _wait_for(what: str, check: object, procs: list[subprocess.Popen], out: Path) -> None:
    """Poll `check()` until true; fail (with the launches' output) if a launch ended or
    TIMEOUT passed first."""
    deadline = time.monotonic() + TIMEOUT
    while not check():
        ended = [p.args for p in procs if p.poll() is not None]
        logs = "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("launch_g*.txt")))
        assert not ended and time.monotonic() < deadline, f"waiting for {what}\n{logs}"
        time.sleep(0.2)


def _count(out: Path, group: int, **match: object) -> int:
    path = out / f"g{group}_r0.jsonl"
    if not path.exists():
        return 0
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return sum(all(r[k] == v for k, v in match.items()) for r in recs)


def test_a_killed_group_leaves_the_other_training_and_heals_from_it(tmp_path: Path) -> None:
    out, steps = tmp_path / "kill", 100
    out.mkdir()
    with _lighthouse(tmp_path, 1) as address:
        survivor = _group(tmp_path, address, 0, 2, out, steps, pace=0.1)
        # group 0 trains first (min 1 group), so that step 0 is its own and group 1 heals
        # from it: started together, either may be first on a loaded machine
        _wait_for("the survivor's first step", lambda: _count(out, 0) >= 1, [survivor], out)
        doomed = _group(tmp_path, address, 1, 2, out, steps, pace=0.1)
        procs = [survivor, doomed]
        _wait_for("5 steps of both", lambda: _count(out, 1, skipped=False) >= 5, procs, out)
        os.killpg(doomed.pid, signal.SIGKILL)  # the whole group: launcher and worker
        doomed.wait()
        killed_at = len(_records(out, 1))
        last = _records(out, 1)[-1]["step"]

        def alone() -> bool:  # 5 steps committed alone since the kill (not those of the start)
            text = (out / "g0_r0.jsonl").read_text().splitlines()
            recs = [json.loads(line) for line in text if line.endswith("}")]
            return sum(r["step"] > last and r["participants"] == 1 and not r["skipped"]
                       for r in recs) >= 5  # fmt: skip

        _wait_for("5 steps of the survivor alone", alone, [survivor], out)
        text = (out / "g0_r0.jsonl").read_text().splitlines()
        at_relaunch = max(json.loads(line)["step"] for line in text if line.endswith("}"))
        rejoined = _group(tmp_path, address, 1, 2, out, steps, pace=0.1)
        _finish([survivor, rejoined], out)
    first, second = _records(out, 0), _records(out, 1)
    # the survivor: one run (no restart), every step once, some committed alone
    committed = [r["step"] for r in first if not r["skipped"]]
    assert committed == list(range(steps))
    assert sum(r["participants"] == 1 and not r["skipped"] for r in first) >= 5
    # the relaunched group's first step is the survivor's, not 0: it healed from it
    before, after = second[:killed_at], second[killed_at:]
    assert after[0]["step"] >= at_relaunch >= before[-1]["step"] + 5, (before[-1], after[0])
    assert [r["step"] for r in after if not r["skipped"]][-1] == steps - 1
    # the lost group's samples of the steps it missed are dropped: the survivor alone reads
    # only its own shard (ids 4k, 4k+1; group 1's are 4k+2, 4k+3)
    alone_ids = {i for r in first if r["participants"] == 1 for i in r["ids"]}
    assert alone_ids and all(i % 4 in (0, 1) for i in alone_ids)
    # the end: the same weights, optimizer and scheduler state, bit for bit
    a, b = _final(out, 0), _final(out, 1)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for i, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][i][name])
            ), (i, name)
    assert a["scheduler"] == b["scheduler"]


def test_diloco_outer_step_equals_the_hand_computation(tmp_path: Path) -> None:
    out, syncs, every = tmp_path / "diloco", 2, 2
    out.mkdir()
    extra = ("--ft_semi_sync", "diloco", "--ft_sync_every", every)
    with _lighthouse(tmp_path, 2) as address:
        procs = [
            _group(tmp_path, address, g, 2, out, syncs, extra=extra, minimum=2) for g in (0, 1)
        ]
        _finish(procs, out)
    records = [_records(out, g) for g in (0, 1)]
    finals = [_final(out, g) for g in (0, 1)]
    assert [len(r) for r in records] == [syncs * every] * 2
    # by hand: each group's inner SGD on its own batches; every `every` steps the
    # pseudo-gradient (last outer weights - local weights) averaged over the groups, and
    # Nesterov SGD (lr 0.7, momentum 0.9) on it from the last outer weights
    models = [_model() for _ in (0, 1)]
    for m in models:
        m.load_state_dict(finals[0]["start"])
    inner = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    outer = {k: v.clone() for k, v in finals[0]["start"].items()}
    momentum: dict[str, torch.Tensor] = {}
    for sync in range(syncs):
        for step in range(sync * every, (sync + 1) * every):
            for g in (0, 1):
                x, y = _samples(records[g][step]["ids"])
                nn.functional.mse_loss(models[g](x), y).backward()
                inner[g].step()
                inner[g].zero_grad()
        local = [m.state_dict() for m in models]
        for key in outer:
            pseudo = ((outer[key] - local[0][key]) + (outer[key] - local[1][key])) / 2
            buf = momentum[key] = pseudo if key not in momentum else 0.9 * momentum[key] + pseudo
            outer[key] = outer[key] - 0.7 * (pseudo + 0.9 * buf)
        for m in models:
            m.load_state_dict(outer)
        for g in (0, 1):  # float32: the same operations, another order of two additions
            got = finals[g]["trajectory"][(sync + 1) * every - 1]
            for key, want in outer.items():
                torch.testing.assert_close(got[key], want, rtol=1e-5, atol=1e-6)


def test_diloco_with_one_group_lost_the_other_continues(tmp_path: Path) -> None:
    out, syncs, every = tmp_path / "diloco_lost", 10, 2
    out.mkdir()
    extra = ("--ft_semi_sync", "diloco", "--ft_sync_every", every)
    with _lighthouse(tmp_path, 1) as address:
        survivor = _group(tmp_path, address, 0, 2, out, syncs, pace=0.1, extra=extra)
        doomed = _group(tmp_path, address, 1, 2, out, syncs, pace=0.1, extra=extra)
        procs = [survivor, doomed]
        both = lambda: _count(out, 1, participants=2) >= every + 1  # noqa: E731  (one sync)
        _wait_for("a sync of both groups", both, procs, out)
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait()
        killed_at = len(_records(out, 0))
        _finish([survivor], out)
    after = _records(out, 0)[killed_at:]
    # the survivor ran on to the last sync, alone, without a restart (one process: one log)
    assert after[-1]["after"] == syncs
    alone = [r["after"] for r in after if r["participants"] == 1]
    assert len(set(alone)) >= 2, after  # at least two syncs of the survivor alone
