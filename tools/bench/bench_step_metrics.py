"""Cost of `Accelerator(log_step_metrics=True)`: step time with the step metrics on and off.

    uv run --frozen --group bench python tools/bench/bench_step_metrics.py [--steps N]
        [--medium-steps N] [--rounds R] [--warmup W] [--no-ddp] [--clock wall|cpu]

The same training loop, written as users write it (a prepared DataLoader, `accumulate`,
`backward`, `step`, `zero_grad`), on two Accelerators that differ only in
`log_step_metrics` (on: `StepMetricsKwargs(print_every=0)`, so the table is not interleaved
with metrics lines; no tracker is configured, so `accelerator.log` has nothing to write).
Two models: a tiny MLP (32-64-64-10, batch 32) where a fixed per-step cost shows, and a
medium one (3 x Linear(1024) + ReLU and a head, batch 64) where compute dominates. Cases: one
process, and 2 gloo processes (DDP, spawned here with torchrun's environment and
OMP_NUM_THREADS=1).

Each round runs both variants for N steps in a rotated order; the figures are the median
microseconds per step over the rounds and the median of the per-round ratios on / off
(quartiles in brackets), and the paired median of the per-round differences on - off (the
metrics' own cost per step, which does not grow with the model: on a shared machine the
medium model's round-to-round noise is larger than 1%, and this difference is the steadier
figure). `--clock cpu` counts this process's CPU time, which leaves out waits for a core.
The warm-up steps (untimed) include the two counted FLOP passes of the one input shape, after
which the count is cached. The on variant's metrics are checked against the analytic FLOP
count before timing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VARIANTS = ("off", "on")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
SHAPES = {"tiny": ((32, 64, 64, 10), 32), "medium": ((1024, 1024, 1024, 1024, 10), 64)}


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    sizes, _ = SHAPES[kind]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def analytic_flops(kind: str, processes: int) -> int:
    """6 x weights x rows for the linear layers, less the first layer's input gradient."""
    sizes, batch = SHAPES[kind]
    weights = sum(a * b for a, b in itertools.pairwise(sizes))
    return (6 * weights - 2 * sizes[0] * sizes[1]) * batch * processes


def make_loader(kind: str, steps: int, seed: int) -> DataLoader:
    sizes, batch = SHAPES[kind]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * batch, sizes[0], generator=g)
    y = torch.randint(0, sizes[-1], (steps * batch,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def build(kind: str, on: bool, steps: int, seed: int) -> tuple[Any, Any, Any, Any]:
    from accel import Accelerator, StepMetricsKwargs

    handlers = [StepMetricsKwargs(print_every=0)] if on else None
    acc = Accelerator(cpu=True, kwargs_handlers=handlers)
    model = make_model(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, make_loader(kind, steps, seed))
    return acc, model, opt, loader


def train(acc: Any, model: nn.Module, opt: Any, loader: Any) -> None:
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(nn.functional.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()


def measure(kind: str, args: argparse.Namespace, world: int) -> dict[str, Any]:
    steps = args.steps if kind == "tiny" else args.medium_steps
    runs = {name: build(kind, name == "on", steps, 7) for name in VARIANTS}
    for acc, model, opt, _ in runs.values():
        warm = make_loader(kind, args.warmup, 8)
        train(acc, model, opt, acc.prepare(warm))
    on_metrics = runs["on"][0].step_metrics
    assert on_metrics["flops_per_step"] == analytic_flops(kind, world), on_metrics
    assert runs["off"][0].step_metrics == {}
    now = CLOCKS[args.clock]
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = VARIANTS[r % 2 :] + VARIANTS[: r % 2]
        times = {}
        for name in order:
            acc, model, opt, loader = runs[name]
            if world > 1:
                dist.barrier()
            start = now()
            train(acc, model, opt, loader)
            times[name] = (now() - start) / steps * 1e6
        rounds.append(times)
    return {"rounds": rounds, "steps": steps, "metrics": on_metrics}


def run_cases(args: argparse.Namespace, world: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    return {kind: measure(kind, args, world) for kind in ("tiny", "medium")}


def run_ddp(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """`world` gloo processes on loopback (accel_state.testing); rank 0's timings come back."""
    from accel_state.testing import run_distributed

    return run_distributed(run_cases, args, world, world_size=world, timeout=3600)[0]


def report(title: str, result: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(
        f"  {'model':<8} {'off us/step':>12} {'on us/step':>12}  on/off ratio (quartiles)"
        f"  on - off, paired median"
    )
    for kind, case in result.items():
        rounds = case["rounds"]
        off = statistics.median(r["off"] for r in rounds)
        on = statistics.median(r["on"] for r in rounds)
        ratios = sorted(r["on"] / r["off"] for r in rounds)
        q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        med = statistics.median(ratios)
        diff = statistics.median(r["on"] - r["off"] for r in rounds)
        print(
            f"  {kind:<8} {off:>12.1f} {on:>12.1f}  {med:.4f} ({q1:.4f}-{q3:.4f})"
            f"  {diff:+.1f} us ({100 * diff / off:+.2f}%)"
        )
    m = result["medium"]["metrics"]
    print(
        f"  medium, last step on: {m['samples_per_sec']:.0f} samples/s, "
        f"{m['tflops_per_sec']:.4f} TFLOP/s, MFU {100 * m['mfu']:.1f}% of measured peak, "
        f"data wait {100 * m['data_wait_fraction']:.1f}%"
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="tiny-model steps per round")
    p.add_argument("--medium-steps", type=int, default=10, help="medium-model steps per round")
    p.add_argument("--rounds", type=int, default=15, help="rounds (median over them)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="wall or CPU time")
    p.add_argument("--no-ddp", action="store_true", help="skip the 2-process case")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, clock {args.clock}")
    report("1 process (1 thread)", run_cases(args, 1))
    if not args.no_ddp:
        report("2 processes, DDP over gloo (1 thread each)", run_ddp(args, 2))


if __name__ == "__main__":
    main()
