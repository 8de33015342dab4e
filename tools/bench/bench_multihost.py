"""Several machines on separate network hosts (tools/netns/hosts.sh): what accel's launch
costs and what it saves, against torchrun + raw PyTorch and accelerate on the same hosts.

1. step: 2 hosts x 1 process, DDP on an MLP (--width, batch 64), the median step time of
   --steps steps after a warm-up, measured inside the workers: `accel launch` + Accelerator
   against `torchrun` + raw DistributedDataParallel and `accelerate launch` + accelerate's
   Accelerator. torchrun and accelerate are given GLOO_SOCKET_IFNAME=eth1 by hand (without
   it both fail: the host name resolves to 127.0.0.1); accel picks it itself.
2. mistakes: the time from the last host's start until every host of the launch has
   exited, for each planted mistake (a machine_rank given twice, the main port held by
   another program, a main address no machine holds, num_processes differing between the
   hosts), capped at --cap seconds (a launch still waiting then "hangs").
3. lost host: 2 hosts in a loop of collectives; host 1's link cut; the time until host 0's
   launcher exits, with accel's hang doctor (--hang_timeout) against raw torchrun (which
   waits for the process group's timeout, 30 minutes by default: capped at --cap).

Needs root (network namespaces). Run twice; report both.

    uv run --frozen --group bench python tools/bench/bench_multihost.py [--skip step,mistakes,lost]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "packages" / "accel-testkit" / "src"))
from accel_testkit.netns import Hosts, make_hosts  # noqa: E402

PY = sys.executable
STEP = """\
import os, statistics, sys, time
import torch
from torch import nn
LIB, STEPS, WIDTH = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(64, WIDTH), torch.randn(64, 1)
if LIB == "raw":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(model)
    rank = dist.get_rank()
    backward = lambda loss: loss.backward()
else:
    Accelerator = __import__(LIB).Accelerator
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, opt)
    rank = acc.process_index
    backward = acc.backward
times = []
for step in range(STEPS + 10):
    t = time.perf_counter()
    backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t)
if rank == 0:
    print("STEP_MS", 1e3 * statistics.median(times[10:]), flush=True)
"""
LOOP = """\
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
for step in range(10**6):
    t = torch.ones(4)
    dist.all_reduce(t)
    if step == 5 and dist.get_rank() == 0:
        open(sys.argv[1], "w").write("ready")
    time.sleep(0.02)
"""
LOOP_ACCEL = """\
import sys, time, torch
from accel import Accelerator
acc = Accelerator(cpu=True)
for step in range(10**6):
    acc.reduce(torch.ones(4), reduction="sum")
    if step == 5 and acc.is_main_process:
        open(sys.argv[1], "w").write("ready")
    time.sleep(0.02)
"""


def env(**extra: str) -> dict[str, str]:
    drop = ("ACCEL_", "SLURM_", "TORCHELASTIC_", "GLOO_", "NCCL_", "MASTER_", "RANK", "WORLD")
    out = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**out, "OMP_NUM_THREADS": "1", **extra}


def tool(name: str) -> list[str]:
    return [str(Path(PY).with_name(name))]


def launcher(kind: str, hosts: Hosts, rank: int, port: int, nproc: int = 2,
             main: str | None = None, machine_rank: int | None = None) -> list[str]:  # fmt: skip
    """The command a user runs on host `rank` for a 2-machine launch of `kind`."""
    main = main or hosts.address(0)
    r = rank if machine_rank is None else machine_rank
    if kind == "accel":
        return [*tool("accel"), "launch", "--cpu", "--num_processes", str(nproc), "--num_machines",
                "2", "--machine_rank", str(r), "--main_process_ip", main, "--main_process_port",
                str(port)]  # fmt: skip
    if kind == "accelerate":
        return [*tool("accelerate"), "launch", "--multi_gpu", "--num_processes", str(nproc),
                "--num_machines", "2", "--machine_rank", str(r), "--main_process_ip", main,
                "--main_process_port", str(port)]  # fmt: skip
    return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
            str(nproc // 2), "--node-rank", str(r), "--master-addr", main, "--master-port",
            str(port)]  # fmt: skip


def start(hosts: Hosts, host: int, argv: list[str], e: dict[str, str], log: Path):
    out = log.open("w")
    return subprocess.Popen(hosts.command(host, argv), env=e, stdout=out,
                            stderr=subprocess.STDOUT, cwd=log.parent)  # fmt: skip


def bench_step(hosts: Hosts, tmp: Path, steps: int, width: int) -> None:
    script = tmp / "step.py"
    script.write_text(STEP)
    results: dict[str, list[float]] = {}
    port = 29600
    for _ in range(2):  # two rounds, the launchers interleaved
        for kind, lib in (("torchrun", "raw"), ("accel", "accel"), ("accelerate", "accelerate")):
            if (
                kind == "accelerate"
                and shutil.which("accelerate", path=str(Path(PY).parent)) is None
            ):
                continue
            port += 1
            manual = {} if kind == "accel" else {"GLOO_SOCKET_IFNAME": "eth1"}
            procs = []
            for rank in (0, 1):
                argv = [
                    *launcher(kind, hosts, rank, port),
                    str(script),
                    lib,
                    str(steps),
                    str(width),
                ]
                procs.append(start(hosts, rank, argv, env(**manual), tmp / f"{kind}{rank}.log"))
            for p in procs:
                p.wait(timeout=600)
            text = (tmp / f"{kind}0.log").read_text()
            line = [ln for ln in text.splitlines() if ln.startswith("STEP_MS")]
            if not line:
                print(f"  {kind}: no step time; its log:\n{text[-2000:]}")
                continue
            results.setdefault(kind, []).append(float(line[0].split()[1]))
    raw = statistics.median(results["torchrun"])
    print(f"step, 2 hosts x 1 process, DDP, MLP width {width}, batch 64, median of {steps} steps:")
    for kind, values in results.items():
        v = statistics.median(values)
        print(f"  {kind:11s} {v:8.2f} ms/step  {v / raw:.3f}x torchrun+raw  (rounds: "
              f"{', '.join(f'{x:.2f}' for x in values)})")  # fmt: skip


def _wait_all(procs, cap: float, started: float) -> tuple[float, list[int | None]]:
    deadline = started + cap
    codes: list[int | None] = [None] * len(procs)
    while time.monotonic() < deadline and any(c is None for c in codes):
        codes = [p.poll() for p in procs]
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    for p in procs:
        if p.poll() is None:
            p.kill()
    return elapsed, codes


def bench_mistakes(hosts: Hosts, tmp: Path, cap: float) -> None:
    script = tmp / "never.py"
    script.write_text("print('TRAINING STARTED', flush=True)\nimport time; time.sleep(600)\n")
    cases = {
        "machine_rank twice": lambda k, p: [(1, launcher(k, hosts, 1, p)),
                                            (2, launcher(k, hosts, 2, p, machine_rank=1)),
                                            (0, launcher(k, hosts, 0, p))],
        "main port held": lambda k, p: [(0, launcher(k, hosts, 0, p)), (1, launcher(k, hosts, 1, p))],
        "no machine at main address": lambda k, p: [
            (1, launcher(k, hosts, 1, p, main="10.213.0.99"))],
        "num_processes differ": lambda k, p: [(0, launcher(k, hosts, 0, p, nproc=2)),
                                              (1, launcher(k, hosts, 1, p, nproc=4))],
    }  # fmt: skip
    print(f"mistakes: seconds from the last host's start until every host exited (cap {cap:.0f} s)")
    port = 29700
    for name, plan in cases.items():
        row = []
        for kind in ("accel", "torchrun", "accelerate"):
            port += 1
            holder = None
            if name == "main port held":
                holder = subprocess.Popen(hosts.command(0, [PY, "-c", (
                    f"import socket,time;s=socket.socket();s.bind(('0.0.0.0',{port}));s.listen();"
                    "time.sleep(600)")]))  # fmt: skip
                time.sleep(1.0)
            manual = {} if kind == "accel" else {"GLOO_SOCKET_IFNAME": "eth1"}
            procs = [start(hosts, h, [*argv, str(script)], env(**manual),
                           tmp / f"m-{kind}-{port}-{i}.log")
                     for i, (h, argv) in enumerate(plan(kind, port))]  # fmt: skip
            elapsed, codes = _wait_all(procs, cap, time.monotonic())
            for p in procs:
                p.wait()
            if holder is not None:
                holder.kill()
                holder.wait()
            logs = [(tmp / f"m-{kind}-{port}-{i}.log").read_text() for i in range(len(procs))]
            trained = any("TRAINING STARTED" in text for text in logs)
            hung = any(c is None for c in codes)
            what = (f"hangs (> {cap:.0f} s)" if hung else f"{elapsed:5.1f} s, exit {codes}") + (
                ", training started" if trained else "")  # fmt: skip
            row.append(f"{kind} {what}")
            if kind == "accel" and set(codes) != {78}:
                print(f"  (accel's logs for {name!r}:)\n" + "\n".join(t[-1500:] for t in logs))
        print(f"  {name:28s} " + " | ".join(row))


def bench_lost(hosts: Hosts, tmp: Path, cap: float, hang_timeout: float) -> None:
    print(f"lost host (link cut mid-collective): seconds until host 0's launcher exits (cap "
          f"{cap:.0f} s)")  # fmt: skip
    port = 29800
    for kind in ("accel", "torchrun"):
        port += 1
        ready = tmp / f"ready-{kind}"
        script = tmp / f"loop-{kind}.py"
        script.write_text(LOOP_ACCEL if kind == "accel" else LOOP)
        extra = ["--hang_timeout", str(hang_timeout)] if kind == "accel" else []
        manual = {} if kind == "accel" else {"GLOO_SOCKET_IFNAME": "eth1"}
        procs = []
        for rank in (0, 1):
            argv = [*launcher(kind, hosts, rank, port), *extra, str(script), str(ready)]
            procs.append(start(hosts, rank, argv, env(**manual), tmp / f"lost-{kind}{rank}.log"))
        while not ready.exists():
            time.sleep(0.05)
        hosts.cut(1)
        cut = time.monotonic()
        elapsed, codes = _wait_all(procs[:1], cap, cut)
        hosts.kill(1)
        hosts.mend(1)
        for p in procs:
            p.kill()
            p.wait()
        text = (tmp / f"lost-{kind}0.log").read_text()
        said = [ln for ln in text.splitlines() if "hang doctor:" in ln]
        what = f"hangs (> {cap:.0f} s)" if codes[0] is None else f"{elapsed:.1f} s, exit {codes[0]}"
        print(f"  {kind:9s} {what}" + (f"\n            {said[0][:160]}" if said else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--cap", type=float, default=120.0)
    parser.add_argument("--hang_timeout", type=float, default=10.0)
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    hosts = make_hosts(f"bench{os.getpid() % 100000}", 3)
    if isinstance(hosts, str):
        raise SystemExit(hosts)
    skip = set(args.skip.split(","))
    try:
        with tempfile.TemporaryDirectory(prefix="accel-bench-mh-") as tmp:
            if "step" not in skip:
                bench_step(hosts, Path(tmp), args.steps, args.width)
            if "mistakes" not in skip:
                bench_mistakes(hosts, Path(tmp), args.cap)
            if "lost" not in skip:
                bench_lost(hosts, Path(tmp), args.cap, args.hang_timeout)
    finally:
        hosts.remove()


if __name__ == "__main__":
    main()
