"""The launch's control plane at N machines or ranks, for bench_scale.py: the preflight, the
rendezvous additions and the hang doctor, each run with accel's real code for one or two
ranks and the rest of the world simulated on loopback (accel_testkit.scale).

- preflight: N machines, N = `accel launch` processes (one per machine). Machine 0 runs the
  real `run_preflight` (its server and its own client); the N-1 others are asyncio clients,
  each from its own loopback address, speaking the real wire protocol (read MAGIC, send the
  facts `host_facts` makes, read the verdict), started 0.1 s after machine 0.
  coordinator_s: from machine 0's start to its verdict; bytes: what all clients received; the note gives one client's answer.
- preflight_dup: as preflight, machine N-1 given machine_rank N-2: the time to the verdict
  that names the rank claimed twice.
- rendezvous: what accel adds to torch's store at a rank's start (the restart-prefixed
  store of `attempt_store` against a real libuv TCPStore, the hang doctor's host record) and
  what it polls there while training runs (the hang doctor's notice), per rank.
- hang_doctor: N ranks, 8 to a host (4 at N=8); one host's ranks wrote no report and its
  address answers nothing (`silent_address`). Rank 0 and rank 1 are real HangDoctors (0.5 s
  timeout, the report path started at once, not exiting); the other ranks are their host
  records in a real TCPStore and their report files. coordinator_s: rank 0's notice to its
  diagnosis, i.e. the time after the hang timeout; per_rank_s: rank 1's same path.
  store_ops and probes: the whole world's, rank 0's own plus rank 1's times the other
  surviving ranks (which take rank 1's path).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
import json
import os
import random
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accel_cli._launch_config import LaunchConfig
from accel_cli._preflight import host_facts, report, run_preflight
from accel_state import hosts
from accel_state._environment import LaunchInfo
from accel_state._store import attempt_store
from accel_state._watchdog import HOST_KEY, HangDoctor
from accel_testkit.scale import (
    CountingStore,
    LineClients,
    OpenCounter,
    loopback_address,
    loopback_store,
    raise_fd_limit,
    silent_address,
)

RANKS_PER_HOST = 8
# ACCEL_SCALE_HANG_TIMEOUT: another timeout (the real 32-rank test's, to set the two side by side)
HANG_TIMEOUT = float(os.environ.get("ACCEL_SCALE_HANG_TIMEOUT", "0.5"))
PREFLIGHT_TIMEOUT = 30.0  # the server's wait for every machine (900 s by default)
_REAL_CLIENT_LIMIT = 1 << 20  # _preflight._read_line's default: what a launcher reads


def _free_port() -> int:
    """A port for machine 0 below the ephemeral range (32768 and up on Linux): thousands of
    clients bound to their own addresses leave TIME_WAIT entries on ephemeral ports, which
    keep a later listener on 0.0.0.0 from binding the same number."""
    for port in random.sample(range(20000, 32000), 200):
        with contextlib.closing(socket.socket()) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-31999")


# -- the preflight --------------------------------------------------------------------------
def preflight_world(n: int, duplicate: bool = False) -> dict[str, Any]:
    """Machine 0's real preflight with N-1 simulated launchers; the figures and the outcome."""
    raise_fd_limit(n + 1024)  # the clients have a process (and a limit) of their own
    port = _free_port()
    config = LaunchConfig(
        num_processes=n,
        num_machines=n,
        machine_rank=0,
        main_process_ip="127.0.0.1",
        main_process_port=port,
    )
    template = host_facts(config, "127.0.0.2", "lo")
    lines = []
    for machine in range(1, n):
        facts = copy.deepcopy(template)
        claimed = n - 2 if duplicate and machine == n - 1 else machine
        facts.update(
            machine_rank=claimed,
            hostname=f"node{machine}",
            address=loopback_address(machine),
        )
        lines.append((json.dumps(facts) + "\n").encode())
    # as `accel launch`: 3 s per connection attempt, 6 s without any answer is a failure
    clients = LineClients(port, lines, timeout=PREFLIGHT_TIMEOUT + 10)
    said: list[str] = []
    outcome: list[Any] = []
    machine0 = threading.Thread(
        target=lambda: outcome.append(
            run_preflight(config, {}, timeout=PREFLIGHT_TIMEOUT, say=said.append)
        )
    )
    started, cpu = time.monotonic(), time.process_time()
    machine0.start()
    time.sleep(0.1)  # machine 0 first: its own launcher is its server's first client
    clients.go()
    machine0.join()
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    clients.stop()
    results = clients.join()
    printed: list[str] = []
    report(outcome[0], printed.append)
    answered = [r for r in results if r.answer]
    sizes = sorted(len(r.answer) for r in answered)
    return {
        "outcome": outcome[0],
        "coordinator_s": elapsed,
        "cpu_s": cpu,
        "bytes": sum(r.received + r.sent for r in results),
        "answer_bytes": sizes,
        "too_long": sum(s > _REAL_CLIENT_LIMIT for s in sizes),
        "errors": Counter(r.error.split(":")[0] for r in results if r.error),
        "printed": printed,
        "answered": len(answered),
        "results": results,
    }


def _preflight(n: int) -> dict[str, Any]:
    world = preflight_world(n)
    fatal = [p for p in world["outcome"].problems if p.fatal]
    sizes = world["answer_bytes"] or [0]
    longest = max(len(line) for line in world["printed"])
    failed = (
        f"FAILED: {fatal[0].line()[:160]!r}, clients {dict(world['errors'])}; " if fatal else ""
    )
    return {
        "coordinator_s": world["coordinator_s"],
        "bytes": world["bytes"],
        "note": (
            f"{failed}N machines; machine 0's CPU {world['cpu_s']:.2f} s; answer {sizes[0]}-{sizes[-1]} B per client "
            f"({world['too_long']} over a launcher's 1 MiB line); report line {longest} chars"
        ),
    }


def _preflight_dup(n: int) -> dict[str, Any]:
    world = preflight_world(n, duplicate=True)
    named = f'"machine_rank {n - 2}", "message": "claimed by 2'
    told = sum(named in r.answer.decode() for r in world["results"])
    sizes = world["answer_bytes"] or [0]
    longest = max(len(line) for line in world["printed"])
    return {
        "coordinator_s": world["coordinator_s"],
        "bytes": world["bytes"],
        "note": (
            f"{'' if told else 'FAILED: not named; '}N machines, rank {n - 2} twice; "
            f"{told} of {n - 1} told; "
            f"answer up to {sizes[-1]} B; report line {longest} chars"
        ),
    }


# -- the rendezvous additions ---------------------------------------------------------------
def _rendezvous(n: int) -> dict[str, Any]:
    server = loopback_store()
    sample = min(n, 16)
    keys_before = server.num_keys()
    started = time.monotonic()
    stores = []
    for rank in range(sample):
        info = LaunchInfo(
            "torchrun",
            rank=rank,
            world_size=n,
            master_addr="127.0.0.1",
            master_port=server.port,
            restart_count=0,
            agent_store=True,
        )
        stores.append(attempt_store(info, datetime.timedelta(seconds=30)))
    per_rank = (time.monotonic() - started) / sample
    keys_added = server.num_keys() - keys_before
    counting = CountingStore(stores[0])
    watched = 1.0
    with tempfile.TemporaryDirectory() as folder:
        doctor = HangDoctor(1000.0, rank=0, world_size=n, folder=folder, store=counting)
        doctor.start()
        init_ops = sum(counting.ops.values())
        time.sleep(watched)
        doctor.stop()
    polls = sum(counting.ops.values()) - init_ops
    every = getattr(doctor, "notice_every", doctor.tick)  # (before 4096 looks/s: each tick)
    return {
        "per_rank_s": per_rank,
        "store_ops": init_ops,
        "note": (
            f"per rank at start: {init_ops} store op(s) by the hang doctor, "
            f"{keys_added / sample:.2f} key(s) by the client; then a notice look every "
            f"{every:.2f} s per rank ({polls} in {watched:g} s), {n / every:.0f}/s at the store"
        ),
    }


# -- the hang doctor ------------------------------------------------------------------------
def _report(rank: int, n: int, host: str) -> str:
    collectives = [
        {"seq": s, "op": "allreduce", "shapes": [[1024]], "dtypes": ["float32"],
         "file": "/job/train.py", "line": 88, "state": "left", "error": None}
        for s in range(50, 57)
    ]  # fmt: skip
    collectives.append({**collectives[-1], "seq": 57, "state": "entered"})
    stack = [
        {"file": "/job/train.py", "line": 88, "function": "main", "module": "__main__",
         "user": True},
        {"file": "/venv/accel_state/_ops.py", "line": 120, "function": "reduce",
         "module": "accel_state._ops", "user": False},
    ]  # fmt: skip
    return json.dumps({
        "rank": rank, "world_size": n, "reason": "stopped by rank 0 (a collective waited)",
        "timeout": HANG_TIMEOUT, "collectives": collectives, "stack": stack,
        "nccl_trace": "skipped", "host": host,
    })  # fmt: skip


def hang_world(n: int, folder: Path) -> dict[str, Any]:
    """A world of N ranks with one host lost; rank 0's and rank 1's real report paths."""
    per_host = min(RANKS_PER_HOST, n // 2)
    lost_host = max(1, (n // 2 - 1) // per_host)  # not host 0, which holds the real ranks
    lost = set(range(lost_host * per_host, (lost_host + 1) * per_host))
    server = loopback_store()
    probes: Counter[str] = Counter()
    probe = hosts.probe

    def counted(addresses: list[str]) -> dict[str, str]:
        probes[threading.current_thread().name] += len(addresses)
        return probe(addresses)

    with silent_address(hosts._PROBE_PORT) as (silent, _):
        host_of = {r: silent if r in lost else loopback_address(r // per_host) for r in range(n)}
        keys = [f"{HOST_KEY}/{r}" for r in range(n)]
        for i in range(0, n, 4096):  # the other ranks' start()
            server.multi_set(keys[i : i + 4096], [host_of[r] for r in range(i, min(n, i + 4096))])
        for rank in range(2, n):
            if rank not in lost:
                (folder / f"rank{rank}.json").write_text(_report(rank, n, host_of[rank]))
        doctors = {}
        for rank in (0, 1):
            doctor = HangDoctor(
                HANG_TIMEOUT,
                rank=rank,
                world_size=n,
                folder=folder,
                store=CountingStore(server),
                exit_process=False,
            )
            doctor.host = host_of[rank]
            doctor.ring.count = 56  # in allreduce #57 (train.py:88), as the simulated ranks
            record = doctor.ring.enter("allreduce")
            record.file, record.line = "/job/train.py", 88
            doctors[rank] = doctor
        took: dict[int, float] = {}

        def run(rank: int) -> None:
            started = time.monotonic()
            own = "rank 0 waited more than 0.5s in allreduce #57"
            doctors[rank].report_and_exit(own if rank == 0 else f"stopped by rank 0 ({own})")
            took[rank] = time.monotonic() - started

        err = io.StringIO()
        hosts.probe = counted
        try:
            with contextlib.redirect_stderr(err), OpenCounter() as opened:
                threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in (0, 1)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        finally:
            hosts.probe = probe
    diagnosis = (folder / "diagnosis.txt").read_text()
    return {
        "lost": sorted(lost),
        "took": took,
        "stores": {r: d.store for r, d in doctors.items()},
        "probes": probes,
        "opened": opened.opened,
        "printed": err.getvalue(),
        "diagnosis": diagnosis,
        "silent": silent,
    }


def _hang_doctor(n: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="accel-scale-hang-"))
    try:
        world = hang_world(n, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    others = n - len(world["lost"]) - 2  # surviving ranks that take rank 1's path
    rank0, rank1 = world["stores"][0], world["stores"][1]
    ops = rank0.reads + rank1.reads * (1 + others)
    probes = world["probes"]["rank0"] + world["probes"]["rank1"] * (1 + others)
    printed = world["printed"].count("\n")
    headline = world["diagnosis"].splitlines()[0]
    assert "is lost" in headline, headline
    return {
        "coordinator_s": world["took"][0],
        "per_rank_s": world["took"][1],
        "store_ops": ops,
        "probes": probes,
        "files": world["opened"]["rank0"],
        "note": (
            f"N ranks, {len(world['lost'])} lost; reads rank 0 {rank0.reads} ({rank0.keys_read} "
            f"keys), rank 1 {rank1.reads}; files opened by rank 1 {world['opened']['rank1']}; "
            f"{printed} lines printed; headline {len(headline)} chars"
        ),
    }


PATHS: dict[str, Callable[[int], dict[str, Any]]] = {
    "preflight": _preflight,
    "preflight_dup": _preflight_dup,
    "rendezvous": _rendezvous,
    "hang_doctor": _hang_doctor,
}
LIMITS: dict[str, int] = {}
