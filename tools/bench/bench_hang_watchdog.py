"""Per-step cost of the hang doctor: `Accelerator(hang_timeout=...)` against off.

    uv run python tools/bench/bench_hang_watchdog.py [--steps N] [--rounds R] [--clock wall|cpu]

One process on the CPU; the same training step (accumulate, forward, backward, optimizer
step, zero_grad, and one `accelerator.reduce` of the loss, a numbered collective) on a tiny MLP
and on a medium one (4 x Linear(1024, 1024)), with the watchdog off and on (its thread
polls every 0.25 s; each backward and optimizer step restarts its clock). Rounds alternate
off and on; the table gives the median microseconds per step over the rounds and the median
of the per-round ratios on / off. With one process `reduce` returns at once, before the ring.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from accel import Accelerator


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "tiny":
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(1024, 10))


def run(kind: str, hang_timeout: float | None, steps: int, clock: str) -> float:
    """Microseconds per step over `steps` steps (after 5 warm-up steps)."""
    accelerator = Accelerator(cpu=True, hang_timeout=hang_timeout)
    model = make_model(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    width = 32 if kind == "tiny" else 1024
    x, y = torch.randn(16, width), torch.randn(16, 10)
    now = time.process_time if clock == "cpu" else time.perf_counter

    def step() -> None:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.reduce(loss.detach())

    for _ in range(5):
        step()
    start = now()
    for _ in range(steps):
        step()
    elapsed = now() - start
    if accelerator._hang_doctor is not None:
        accelerator._hang_doctor.stop()
    return elapsed / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"| model | off us/step | on us/step | on / off (median of {args.rounds} rounds) |")
    print("|---|---|---|---|")
    for kind, steps in (("tiny", args.steps), ("medium", max(20, args.steps // 10))):
        off, on, ratios = [], [], []
        for r in range(args.rounds):
            order = (None, 600.0) if r % 2 == 0 else (600.0, None)
            got = {t: run(kind, t, steps, args.clock) for t in order}
            off.append(got[None])
            on.append(got[600.0])
            ratios.append(got[600.0] / got[None])
        print(
            f"| {kind} | {statistics.median(off):.1f} | {statistics.median(on):.1f} | "
            f"{statistics.median(ratios):.3f} |"
        )


if __name__ == "__main__":
    main()
