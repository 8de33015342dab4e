"""accel's own cost per training step, in figures that a shared machine reproduces.

    uv run --frozen --group bench python tools/bench/bench_step_overhead.py [--steps N]
        [--rounds R] [--profile K]

bench_accelerator.py's ratio (the tiny MLP's step time against raw PyTorch) moves by 10-20%
between runs on a busy 2-core machine, more than the 3% it tests. Two figures here do not:

- calls: the Python calls (frames entered; C calls not counted) of one steady-state
  optimizer step, per micro-batch, of bench_accelerator's raw loop and of accel's loop
  (``with acc.accumulate(model): ...; acc.backward(loss); opt.step(); opt.zero_grad()``), on the
  tiny MLP, one process, CPU, at gradient accumulation 1 and 4: exact, and listed by function
  for what accel adds (accel_testkit.steps.count_calls; accelerate's count beside them when
  importable). packages/accel/tests/test_step_overhead.py holds the count to its budget.
- own time: the CPU time of this thread per step (`time.thread_time_ns`, the best of R
  interleaved rounds of N steps) of both loops with a step that does no work (a model that
  returns its parameter, the loss that is that output, an optimizer whose step and zero_grad do
  nothing): the difference is the time of accel's own code per step. Waiting for a core is not
  CPU time, and the best round is the one that other jobs disturbed least.

`--profile K` runs cProfile over accel's no-op loop at accumulation K instead. The load average
is printed with each run: the figures above hold under load, the time somewhat less than the
counts.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

import torch
from bench_accelerator import accelerate_importable, make_batches, make_model, make_optimizer

from accel_testkit.steps import (
    CallCount,
    Loop,
    NoOpModel,
    NoOpOptimizer,
    accelerator_loop,
    count_calls,
    identity_loss,
    raw_loop,
)

ACCUMULATIONS = (1, 4)
CALLS_TARGET = 1.05  # accel's Python calls per micro-batch against raw's
OWN_TIME_TARGET_US = 1.0


def accelerator(library: str, accumulation: int) -> Any:
    module = __import__(library)
    return module.Accelerator(cpu=True, gradient_accumulation_steps=accumulation)


# -- calls ---------------------------------------------------------------------------------
def steady_count(loop: Loop, batches: list[Any], accumulation: int) -> CallCount:
    """The calls of one optimizer step (K micro-batches), after two steps that warmed every
    lazy path (the optimizer's state, autograd's first backward)."""
    loop(batches[: 2 * accumulation])
    return count_calls(loop, batches[2 * accumulation : 3 * accumulation])


def tiny_loops(accumulation: int, with_accelerate: bool) -> dict[str, Loop]:
    """bench_accelerator's raw loop and the accelerators' loops on the tiny MLP."""
    model = make_model("tiny", 0, 0)
    loops = {"raw": raw_loop(model, make_optimizer(model), accumulation)}
    for library in ("accel", "accelerate") if with_accelerate else ("accel",):
        acc = accelerator(library, accumulation)
        model = make_model("tiny", 0, 0)
        model, opt = acc.prepare(model, make_optimizer(model))
        loops[library] = accelerator_loop(acc, model, opt)
    return loops


def report_calls(with_accelerate: bool) -> None:
    print("\nPython calls per micro-batch, one steady optimizer step, tiny MLP (exact):")
    for k in ACCUMULATIONS:
        batches = make_batches("tiny", 0, 3 * k, 0)
        counts = {}
        for name, loop in tiny_loops(k, with_accelerate).items():
            counts[name] = steady_count(loop, batches, k)  # each before the next accelerator
        raw = counts["raw"].total
        line = f"  accumulation {k}: raw {raw / k:.2f}"
        for name in ("accel", "accelerate"):
            if name in counts:
                total = counts[name].total
                line += f", {name} {total / k:.2f} (x{total / raw:.3f})"
        verdict = "MET" if counts["accel"].total <= CALLS_TARGET * raw else "MISSED"
        print(f"{line}  accel <= x{CALLS_TARGET}: {verdict}")
        accel = counts["accel"]
        own = ", ".join(f"{n.rpartition('.')[2]} {c / k:g}" for n, c in accel.accel.items())
        print(f"    in accel's packages ({sum(accel.accel.values()) / k:g}): {own}")
        extra = accel.other - counts["raw"].other
        fewer = counts["raw"].other - accel.other
        print(
            f"    elsewhere, beyond raw's: {dict(extra) or 'none'}; fewer: {dict(fewer) or 'none'}"
        )


# -- own time ------------------------------------------------------------------------------
def noop_loops(accumulation: int) -> dict[str, Loop]:
    model = NoOpModel()
    loops = {"raw": raw_loop(model, NoOpOptimizer(model.parameters()), accumulation, identity_loss)}
    acc = accelerator("accel", accumulation)
    model = NoOpModel()
    model, opt = acc.prepare(model, NoOpOptimizer(model.parameters()))
    loops["accel"] = accelerator_loop(acc, model, opt, identity_loss)
    return loops


def cpu_ns_per_step(loop: Loop, batches: list[Any]) -> float:
    gc.collect()
    start = time.thread_time_ns()
    loop(batches)
    return (time.thread_time_ns() - start) / len(batches)


def report_own_time(steps: int, rounds: int) -> None:
    print(f"\naccel's own CPU time per micro-batch, no-op model/loss/optimizer "
          f"(best of {rounds} interleaved rounds of {steps} micro-batches, thread CPU time):")  # fmt: skip
    batches = [(None, None)] * steps
    for k in ACCUMULATIONS:
        loops = noop_loops(k)
        loops["raw"](batches), loops["accel"](batches)
        times: dict[str, list[float]] = {"raw": [], "accel": []}
        for r in range(rounds):
            for name in ("raw", "accel") if r % 2 == 0 else ("accel", "raw"):
                times[name].append(cpu_ns_per_step(loops[name], batches))
        best = {name: min(t) / 1e3 for name, t in times.items()}
        own = best["accel"] - best["raw"]
        paired = statistics.median((a - b) / 1e3 for a, b in zip(times["accel"], times["raw"]))
        verdict = "MET" if own <= OWN_TIME_TARGET_US else "MISSED"
        print(f"  accumulation {k}: raw {best['raw']:.2f} us, accel {best['accel']:.2f} us: "
              f"accel's own {own:.2f} us (median of paired rounds {paired:.2f})  "
              f"<= {OWN_TIME_TARGET_US} us: {verdict}")  # fmt: skip


def profile(accumulation: int, steps: int) -> None:
    import cProfile
    import pstats

    loop = noop_loops(accumulation)["accel"]
    batches = [(None, None)] * steps
    loop(batches)
    prof = cProfile.Profile()
    prof.runcall(loop, batches)
    print(f"cProfile of accel's no-op loop, accumulation {accumulation}, {steps} micro-batches:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="micro-batches per timed round")
    p.add_argument("--rounds", type=int, default=31, help="timed rounds (best of them)")
    p.add_argument("--profile", type=int, metavar="K", help="cProfile accel's no-op loop at K")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.profile:
        profile(args.profile, args.steps)
        return
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, CPU, 1 thread; load average (1, 5, 15 min) {load}; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    report_calls(accelerate_importable())
    report_own_time(args.steps, args.rounds)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at the end: {load}")


if __name__ == "__main__":
    main()
