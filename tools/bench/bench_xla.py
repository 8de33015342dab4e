"""Step overhead of accel's XLA path over raw torch-xla, and of accelerate's, on XLA's CPU device.

    PJRT_DEVICE=CPU .venv-torch29/bin/python tools/bench/bench_xla.py [--steps N] [--rounds R]

Needs torch 2.9 + torch-xla 2.9 (.ci/run's second lane, `.venv-torch29`); accelerate is timed
when it is installed there (`uv pip install -p .venv-torch29 accelerate==1.15.0`; it is not
part of the lane).

The same loop three ways, each in a process of its own (torch-xla's runtime is per process):
an MLP (256 -> 512 -> 512 -> 10, 0.4 M parameters), SGD, batches of 64 from a DataLoader.

- raw: the model moved with `.to(device)` and the optimizer made from the moved parameters
  (moving to XLA makes new Parameter objects), batches through torch-xla's `MpDeviceLoader`,
  `loss.backward()`, `xm.optimizer_step(optimizer)`, `optimizer.zero_grad()`;
- accel: `Accelerator()` (the "xla" strategy), `prepare(model, optimizer, loader)`,
  `accelerator.backward(loss)`, `optimizer.step()`, `optimizer.zero_grad()`;
- accelerate: the same code with accelerate 1.15's `Accelerator`.

Each process runs 20 warm-up steps (the graphs compile), then `--steps` timed steps; the time
is from the first timed step to `xm.wait_device_ops()` after the last, over the steps (the
device runs asynchronously: the wait counts what the host queued). The rounds alternate the
three; the median over rounds is reported with the ratio to raw. The machine's load average
is printed: on a shared machine the figures move with it. So each kind's torch-xla counts
are printed too, which load does not move: graphs executed and compiled, transfers from the
device (a host sync in the step), mark steps (graph cuts, empty ones included).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

WARMUP = 20
BATCH = 64

WORKER = r"""
import json, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

kind, steps, warmup, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
n = (steps + warmup) * batch
data = DataLoader(TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,))),
                  batch_size=batch)
loss_fn = nn.CrossEntropyLoss()
import torch_xla.core.xla_model as xm

if kind == "raw":
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl

    device = torch_xla.device()
    model.to(device)  # new Parameters on XLA: the optimizer is made from them, as torch-xla's
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # examples do
    loader = pl.MpDeviceLoader(data, device)

    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        optimizer.zero_grad()
else:
    if kind == "accel":
        from accel import Accelerator
    else:
        from accelerate import Accelerator
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, data)

    def step(x, y):
        loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

start = None
for i, (x, y) in enumerate(loader):
    if i == warmup:
        xm.wait_device_ops()
        start = time.perf_counter()
    step(x, y)
xm.wait_device_ops()
elapsed = time.perf_counter() - start
import torch_xla.debug.metrics as met

counts = {name: (met.metric_data(name) or (0,))[0]
          for name in ("ExecuteTime", "CompileTime", "TransferFromDeviceTime")}
counts["MarkStep"] = met.counter_value("MarkStep") or 0
print(json.dumps({"kind": kind, "step_ms": elapsed / steps * 1e3, "counts": counts}))
"""


def run_one(kind: str, steps: int) -> dict | str:
    """The step time (ms) and torch-xla's counts of one process of `kind`, or its error's
    last line."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1"}
    env.pop("ACCEL_LAUNCH_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", WORKER, kind, str(steps), str(WARMUP), str(BATCH)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"exit {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch
    import torch_xla

    kinds = ["raw", "accel"]
    if importlib.util.find_spec("accelerate") is not None:
        kinds.append("accelerate")
    print(f"torch {torch.__version__}, torch-xla {torch_xla.__version__}, XLA's CPU device")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    counts: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for _ in range(args.rounds):
        for kind in kinds:
            if kind in failed:
                continue
            got = run_one(kind, args.steps)
            if isinstance(got, str):
                failed[kind] = got
            else:
                times[kind].append(got["step_ms"])
                counts[kind] = got["counts"]
    raw = statistics.median(times["raw"])
    for kind in kinds:
        if kind in failed:
            print(f"{kind:>10}: did not run: {failed[kind]}")
            continue
        ms = statistics.median(times[kind])
        each = ", ".join(f"{t:.3f}" for t in times[kind])
        print(f"{kind:>10}: {ms:.3f} ms/step (rounds: {each}); {ms / raw:.3f}x raw torch-xla")
        print(f"{'':>12}torch-xla's counts over {WARMUP + args.steps} steps: {counts[kind]}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(time.strftime("%Y-%m-%d %H:%M"))


if __name__ == "__main__":
    main()
