"""Fault tolerance across replica groups (torchft): its cost without failures, and what a
failure costs, against restart-the-world, on one job.

    uv run python tools/bench/bench_ft.py [--steps N] [--save_every N] [--timeout S]
                                          [--no_failure_only]

The job: a medium MLP (4 x Linear(1024, 1024), 4.2 M parameters), SGD, 32 random samples
per process per step, 2 processes on the CPU (gloo on loopback), each launched for real with
`accel launch`; the lighthouse runs in this process (`serve_lighthouse`, join 1 s, heartbeat
5 s). Each worker writes one JSON line per optimizer step (start, end, step, committed,
participants, and for the fault-tolerant engine the seconds the step waited in the quorum
(torchft's start_quorum and wait_quorum) and the commit).

1. No failure, the same 2 processes: plain DDP (one launch of 2); the fault-tolerant engine
   as 2 replica groups of 1 (the gradient average is torchft's, across groups) and as 1 group
   of 2 (DDP inside the group; the quorum and commit are all that is added). Median step time
   of rank 0 over `--steps` steps after 10 warm-up steps, the median over `--rounds` rounds
   (each round runs the three in turn); ratio to DDP, and each round's ratio to that round's
   DDP (on a shared machine the load moves between rounds more than within one). Also the median time from the end of
   the backward to the end of `optimizer.step()` (the cross-group average, the commit and
   the optimizer's own step). A launch that loses its port to another process (picked free,
   taken before torchrun binds it) is launched again 5 s later, up to 8 times
   (other work on a shared machine can hold most ephemeral ports in TIME_WAIT).
2. One failure, fault tolerant (2 groups of 1): group 1 is SIGKILLed (launcher and worker)
   once the run is at step 20; it is relaunched 10 steps of the survivor later. Lost time =
   wall time from the start of the step in progress at the kill to the end of the first step
   committed after it, minus the steps of progress made in that window x the normal step
   (the median before the kill). Time to rejoin: from the relaunch to the end of the healed
   group's first committed step (start, imports, prepare, quorum, heal from the peer, one step),
   and the survivor's lost time around the rejoin, by the same formula against its median step
   alone (on a machine with few cores, the new process's start slows the survivor's steps).
3. One failure, restart-the-world: plain DDP on 2 processes under `accel launch
   --max_restarts 1`, `save_state` every `--save_every` steps, `load_state_if_any()` at start;
   the rank 1 worker is SIGKILLed half-way between two checkpoints (after 25 steps with the
   default 10, at step 24 counted from 0: steps 20-24 to redo); torchrun restarts both, they
   resume from the checkpoint of step 20.
   Lost time, same formula, up to the end of the first step past the step of the kill. Also
   the time of one `save_state` (what the checkpoints cost without failure: that / N per step).

Ratios are printed. The machine's load average (`os.getloadavg`) is printed at the start and
the end: on a shared 2-core machine the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

STARTED = time.time()  # a worker's interpreter is up
HERE = Path(__file__).resolve()
WIDTH, LAYERS, BATCH = 1024, 4, 32
WARMUP = 10
KILL_AT, REJOIN_AFTER = 20, 10
ATTEMPTS = 8  # launches of one engine in one round when its port was taken meanwhile


# -- the worker (run by `accel launch`) ------------------------------------------------------
def worker(out: Path, steps: int, save_every: int, started: float) -> None:
    import torch
    from torch import nn

    from accel import Accelerator, ProjectConfiguration

    imported = time.time()

    class Progress:
        def __init__(self) -> None:
            self.step = 0

        def state_dict(self) -> dict[str, int]:
            return {"step": self.step}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.step = state["step"]

    project = ProjectConfiguration(
        project_dir=str(out / "project"), automatic_checkpoint_naming=True, fsync=False
    )
    accelerator = Accelerator(cpu=True, project_config=project)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    prepared = time.time()
    strategy = accelerator.strategy
    manager = getattr(strategy, "manager", None)
    progress = Progress()
    spent = {"quorum": 0.0, "commit": 0.0}
    if manager is not None:
        _time_calls(manager, spent)
        group = strategy.plugin.replica_group_id
    else:
        group = 0
        accelerator.register_for_checkpointing(progress)
        if save_every:
            accelerator.load_state_if_any()
    rank = accelerator.process_index
    log = (out / f"g{group}_r{rank}.jsonl").open("a")
    gen = torch.Generator().manual_seed(1 + group * 100 + rank)
    x, y = torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, 1, generator=gen)
    stop = out / "stop_at"
    first = True
    while True:
        step = strategy.current_step if manager is not None else progress.step
        limit = int(stop.read_text()) if stop.exists() else steps
        if step >= limit:
            break
        spent.update(quorum=0.0, commit=0.0)
        t0 = time.time()
        loss = nn.functional.mse_loss(model(x), y)
        step = strategy.current_step if manager is not None else step  # a healed group's
        accelerator.backward(loss)
        backward = time.time()
        optimizer.step()
        optimizer.zero_grad()
        t1 = time.time()
        committed = not optimizer.step_was_skipped
        progress.step += committed
        record = {
            "step": step, "t0": t0, "t1": t1, "committed": committed, "pid": os.getpid(),
            "after_backward": t1 - backward,
            "participants": manager.num_participants() if manager is not None else None,
            **spent, "started": started if first else None, "imported": imported,
            "prepared": prepared,
        }  # fmt: skip
        first = False
        if save_every and manager is None and progress.step % save_every == 0:
            accelerator.save_state()
            record["save"] = time.time() - t1
        log.write(json.dumps(record) + "\n")
        log.flush()
    if manager is not None:
        strategy.shutdown()


def _time_calls(manager: object, spent: dict[str, float]) -> None:
    """Add the seconds spent in the manager's quorum and commit to `spent`."""
    calls = (("start_quorum", "quorum"), ("wait_quorum", "quorum"), ("should_commit", "commit"))
    inside = [False]  # a synchronous start_quorum calls wait_quorum: counted once
    for name, key in calls:
        call = getattr(manager, name)

        def timed(*args: object, _call=call, _key=key, **kwargs: object) -> object:
            if inside[0]:
                return _call(*args, **kwargs)
            inside[0] = True
            t = time.perf_counter()
            try:
                return _call(*args, **kwargs)
            finally:
                spent[_key] += time.perf_counter() - t
                inside[0] = False

        setattr(manager, name, timed)


# -- launching -------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHFT_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", *drop))}
    return {**env, "OMP_NUM_THREADS": "1"}


def serve_lighthouse(min_replicas: int, bind: str) -> object:
    from accel_parallel.fault_tolerance import serve_lighthouse as serve

    return serve(min_replicas, bind)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    out: Path, steps: int, *, processes: int, ft: tuple[int, int, str] | None = None,
    save_every: int = 0, restarts: int = 0, timeout: float = 10.0,
) -> subprocess.Popen:  # fmt: skip
    flags = ["--cpu", "--num_processes", processes, "--main_process_port", _free_port()]
    if restarts:
        flags += ["--max_restarts", restarts]
    group = 0
    if ft is not None:
        group, groups, lighthouse = ft
        flags += [
            "--ft_replica_group_id", group, "--ft_num_replica_groups", groups,
            "--ft_lighthouse", lighthouse, "--ft_timeout", timeout,
        ]  # fmt: skip
    argv = [sys.executable, "-m", "accel_cli.main", "launch", *map(str, flags), str(HERE)]
    argv += ["--worker", str(out), "--steps", str(steps), "--save_every", str(save_every)]
    log = (out / f"launch_g{group}.txt").open("a")
    return subprocess.Popen(
        argv, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def records(out: Path, group: int = 0, rank: int = 0) -> list[dict]:
    path = out / f"g{group}_r{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_all(procs: list[subprocess.Popen], out: Path, limit: float = 600) -> None:
    deadline = time.monotonic() + limit
    for proc in procs:
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = "timeout"
        if rc != 0:
            logs = "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("launch_g*.txt")))
            raise SystemExit(f"a launch ended with {rc}:\n{logs}")


def wait_for(what: str, check, procs: list[subprocess.Popen], limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise SystemExit(f"waiting for {what}: a launch ended or {limit} s passed")
        time.sleep(0.02)


def normal_step(recs: list[dict]) -> float:
    return statistics.median(r["t1"] - r["t0"] for r in recs[WARMUP:] if r["committed"])


# -- 1. no failure ---------------------------------------------------------------------------
def no_failure(root: Path, steps: int, rounds: int) -> dict[str, dict]:
    """Each engine once per round (rounds alternate the engines); with 2 groups the
    lighthouse waits for both (min_replicas 2). Per engine: the median over rounds."""
    per_round = [_no_failure(root / f"round{i}", steps) for i in range(rounds)]
    out = {
        name: {k: statistics.median(r[name][k] for r in per_round) for k in per_round[0][name]}
        for name in per_round[0]
    }
    for name in out:  # each round's ratio to that round's DDP (the load moves between rounds)
        out[name]["rounds"] = [r[name]["step_ms"] / r["ddp 1x2"]["step_ms"] for r in per_round]
    return out


def _no_failure(root: Path, steps: int) -> dict[str, dict]:
    total = WARMUP + steps
    results = {}
    for name, groups in (("ddp 1x2", 0), ("ft 2x1", 2), ("ft 1x2", 1)):
        for attempt in range(ATTEMPTS):  # a port picked free may be taken before it is bound
            out = root / name.replace(" ", "_") / str(attempt)
            out.mkdir(parents=True)
            try:
                _run_engine(out, total, groups)
                break
            except SystemExit as err:
                if "EADDRINUSE" not in str(err) or attempt == ATTEMPTS - 1:
                    raise
                print(f"{name}: a port was taken, launching again in 5 s", flush=True)
                time.sleep(5)
        recs = records(out)[WARMUP:]
        assert all(r["committed"] and r["participants"] in (None, groups) for r in recs)
        results[name] = {
            "step_ms": 1e3 * statistics.median(r["t1"] - r["t0"] for r in recs),
            "quorum_ms": 1e3 * statistics.median(r["quorum"] for r in recs),
            "commit_ms": 1e3 * statistics.median(r["commit"] for r in recs),
            "after_backward_ms": 1e3 * statistics.median(r["after_backward"] for r in recs),
        }
    return results


def _run_engine(out: Path, total: int, groups: int) -> None:
    """Plain DDP (groups 0), 2 groups of 1 or 1 group of 2, to the end."""
    server = serve_lighthouse(max(groups, 1), "127.0.0.1:0")
    address = server.address()
    try:
        if not groups:
            procs = [launch(out, total, processes=2)]
        elif groups == 2:
            procs = [launch(out, total, processes=1, ft=(g, 2, address)) for g in (0, 1)]
        else:
            procs = [launch(out, total, processes=2, ft=(0, 1, address))]
        wait_all(procs, out)
    finally:
        server.shutdown()


# -- 2. one failure, fault tolerant ----------------------------------------------------------
def lost_time(recs: list[dict], at: float, normal: float, past: int | None = None) -> dict:
    """From the start of the step in progress at `at` to the end of the first committed step
    after it (with `past`: the first whose step exceeds `past`), minus the progress x normal."""
    before = [r for r in recs if r["t0"] <= at]
    start_rec = before[-1] if before else recs[0]
    after = [r for r in recs if r["t1"] > at and r["committed"]]
    if past is not None:
        after = [r for r in after if r["step"] > past]
    end_rec = after[0]
    progress = end_rec["step"] + 1 - start_rec["step"]
    window = end_rec["t1"] - start_rec["t0"]
    return {"window_s": window, "progress": progress, "lost_s": window - progress * normal}


def ft_failure(root: Path, timeout: float) -> dict:
    out = root / "ft_failure"
    out.mkdir()
    server = serve_lighthouse(1, "127.0.0.1:0")
    try:
        return _ft_failure(out, server.address(), timeout)
    finally:
        server.shutdown()


def _ft_failure(out: Path, lighthouse: str, timeout: float) -> dict:
    big = 10_000
    survivor = launch(out, big, processes=1, ft=(0, 2, lighthouse), timeout=timeout)
    doomed = launch(out, big, processes=1, ft=(1, 2, lighthouse), timeout=timeout)

    def both() -> bool:  # group 0 may start alone; the kill comes in a step of both
        recs = records(out, 0)
        return any(r["step"] >= KILL_AT and r["participants"] == 2 for r in recs)

    wait_for("both groups at the kill step", both, [survivor, doomed])
    killed = time.time()
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait()
    at_kill = max(r["step"] for r in records(out, 0))

    def alone_steps() -> int:
        return sum(r["committed"] and r["t0"] > killed for r in records(out, 0))

    wait_for("the survivor's steps alone", lambda: alone_steps() >= REJOIN_AFTER, [survivor])
    relaunched = time.time()
    rejoined = launch(out, big, processes=1, ft=(1, 2, lighthouse), timeout=timeout)

    def back() -> bool:
        return any(r["committed"] and r["t0"] > relaunched for r in records(out, 1))

    wait_for("the healed group's first commit", back, [survivor, rejoined])
    (out / "stop_at").write_text(str(max(r["step"] for r in records(out, 0)) + 5))
    wait_all([survivor, rejoined], out)
    recs = records(out, 0)
    normal = statistics.median(
        r["t1"] - r["t0"] for r in recs if r["participants"] == 2 and r["t1"] < killed
    )
    healed = [r for r in records(out, 1) if r["t0"] > relaunched]
    first_commit = next(r for r in healed if r["committed"])
    started = next(r["started"] for r in healed if r["started"])
    # the survivor around the rejoin: from the relaunch to its first step with 2 groups,
    # against its normal step alone
    alone = statistics.median(
        r["t1"] - r["t0"] for r in recs if r["participants"] == 1 and killed < r["t1"] < relaunched
    )
    joined = next(r for r in recs if r["t0"] > relaunched and r["participants"] == 2)
    rejoin_window = joined["t1"] - relaunched
    rejoin_steps = sum(
        r["committed"] for r in recs if r["t0"] >= relaunched and r["t1"] <= joined["t1"]
    )
    return {
        "normal_ms": 1e3 * normal,
        "at_kill": at_kill,
        "failure": lost_time(recs, killed, normal),
        "rejoin_s": first_commit["t1"] - relaunched,
        "rejoin_start_s": started - relaunched,
        "rejoin_first_step": first_commit["step"],
        "rejoin_imported_s": first_commit["imported"] - relaunched,
        "rejoin_prepared_s": first_commit["prepared"] - relaunched,
        "rejoin_first_forward_s": first_commit["t0"] - relaunched,
        "alone_ms": 1e3 * alone,
        "survivor_rejoin_lost_s": rejoin_window - rejoin_steps * alone,
    }


# -- 3. one failure, restart-the-world -------------------------------------------------------
def restart_the_world(root: Path, save_every: int) -> dict:
    out = root / "restart"
    out.mkdir()
    kill_at = 2 * save_every + save_every // 2
    steps = kill_at + save_every + 5
    proc = launch(out, steps, processes=2, save_every=save_every, restarts=1)
    wait_for("rank 1 at the kill step", lambda: len(records(out, 0, 1)) >= kill_at, [proc])
    victim = records(out, 0, 1)[-1]["pid"]
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    wait_all([proc], out)
    recs = records(out)
    first = [r for r in recs if r["pid"] == recs[0]["pid"]]
    at_kill = max(r["step"] for r in first if r["t0"] <= killed)
    normal = statistics.median(r["t1"] - r["t0"] for r in first[WARMUP:] if r["t1"] < killed)
    saves = [r["save"] for r in first if "save" in r]
    resumed = [r for r in recs if r["pid"] != recs[0]["pid"]]
    return {
        "normal_ms": 1e3 * normal,
        "save_ms": 1e3 * statistics.median(saves),
        "at_kill": at_kill,
        "resumed_at": resumed[0]["step"],
        "failure": lost_time(recs, killed, normal, past=at_kill),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", type=Path)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--save_every", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no_failure_only", action="store_true", help="only part 1")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.save_every, STARTED)
    import tempfile

    root = args.out or Path(tempfile.mkdtemp(prefix="bench_ft_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}; out: {root}", flush=True)
    steady = no_failure(root, args.steps, args.rounds)
    if not args.no_failure_only:
        ft = ft_failure(root, args.timeout)
        world = restart_the_world(root, args.save_every)
    print(f"load average at end: {os.getloadavg()}")
    ddp = steady["ddp 1x2"]["step_ms"]
    print(f"\nno failure: median step of rank 0 over {args.steps} steps (2 processes), "
          f"median of {args.rounds} rounds")  # fmt: skip
    print("| engine | step (ms) | / DDP | each round / its DDP | quorum (ms) | commit (ms) | "
          "after backward (ms) |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for name, r in steady.items():
        rounds = ", ".join(f"{x:.2f}" for x in r["rounds"])
        print(
            f"| {name} | {r['step_ms']:.1f} | {r['step_ms'] / ddp:.3f} | {rounds} | "
            f"{r['quorum_ms']:.2f} | {r['commit_ms']:.2f} | {r['after_backward_ms']:.2f} |"
        )
    if args.no_failure_only:
        return
    f, w = ft["failure"], world["failure"]
    print(f"\none failure (2 processes; normal step: ft {ft['normal_ms']:.1f} ms, ddp "
          f"{world['normal_ms']:.1f} ms)")  # fmt: skip
    print("| | window (s) | steps of progress in it | lost (s) |\n|---|---|---|---|")
    print(f"| fault tolerant, group 1 killed at step {ft['at_kill']} | {f['window_s']:.2f} | "
          f"{f['progress']} | {f['lost_s']:.2f} |")  # fmt: skip
    print(f"| restart-the-world, rank 1 killed at step {world['at_kill']}, resumed at "
          f"{world['resumed_at']} | {w['window_s']:.2f} | {w['progress']} | {w['lost_s']:.2f} |")  # fmt: skip
    print(f"ratio restart-the-world / fault tolerant: {w['lost_s'] / f['lost_s']:.1f}x")
    print(f"save_state every {args.save_every} steps: {world['save_ms']:.0f} ms each, "
          f"{world['save_ms'] / args.save_every:.1f} ms per step without failure")  # fmt: skip
    print(f"healed group: {ft['rejoin_s']:.2f} s from relaunch to the end of its first "
          f"committed step (step {ft['rejoin_first_step']}): script started "
          f"{ft['rejoin_start_s']:.2f} s, torch and accel imported "
          f"{ft['rejoin_imported_s']:.2f} s, prepared {ft['rejoin_prepared_s']:.2f} s, first "
          f"forward {ft['rejoin_first_forward_s']:.2f} s; the survivor (alone: "
          f"{ft['alone_ms']:.1f} ms a step) lost {ft['survivor_rejoin_lost_s']:.2f} s "
          f"over that time")  # fmt: skip


if __name__ == "__main__":
    main()
