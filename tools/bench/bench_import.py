"""Import cost of each accel package over `import torch`, in fresh interpreters.

Each run is a new interpreter that times `import torch` and then the statement under test
(torch already loaded), so the second number is what the statement itself adds. Prints the
median over --runs runs and the ratio (torch + statement) / torch.

Two tables:

- side by side: `from accel import Accelerator` and `from accelerate import Accelerator` (when
  accelerate is importable), with the same protocol, the runs of the two interleaved so that
  machine noise hits both alike; the ratio of each is the median of its per-run ratios.
  Targets: accel at or under accelerate, and within 1.03x of `import torch`;
- each leaf package: `import <package>`. Target: under 1.05 for every leaf package.

The workspace is compiled to bytecode first (see _bytecode.py), as an installed wheel would be,
so every interpreter loads bytecode for accel as it does for torch and accelerate. Wall clock by
default; `--clock cpu` counts the interpreter's CPU time (user + system), which leaves out the
waits for a core on a machine shared with other jobs.

    uv run --frozen --group bench python tools/bench/bench_import.py [--runs 7] [--clock cpu]
        [--skip-packages]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys

PACKAGES = [
    "accel_state",
    "accel_data",
    "accel_precision",
    "accel_parallel",
    "accel_bigmodel",
    "accel_tracking",
    "accel_cli",
    "accel",
]
SIDE_BY_SIDE = {
    "accel": "from accel import Accelerator",
    "accelerate": "from accelerate import Accelerator",
}
PROBE = """
import json, time
clock = time.{clock}
t0 = clock()
import torch
t1 = clock()
{statement}
t2 = clock()
print(json.dumps([t1 - t0, t2 - t1]))
"""
CLOCKS = {"wall": "perf_counter", "cpu": "process_time"}


def probe(statement: str, clock: str) -> tuple[float, float]:
    """(seconds of `import torch`, seconds `statement` adds) in one fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(statement=statement, clock=CLOCKS[clock])],
        capture_output=True,
        text=True,
        check=True,
    )
    torch_s, added_s = json.loads(out.stdout.strip().splitlines()[-1])
    return torch_s, added_s


def measure(statement: str, runs: int, clock: str) -> tuple[float, float]:
    torch_times, added_times = [], []
    for _ in range(runs):
        torch_s, added_s = probe(statement, clock)
        torch_times.append(torch_s)
        added_times.append(added_s)
    return statistics.median(torch_times), statistics.median(added_times)


def side_by_side(runs: int, clock: str) -> None:
    """`from accel import Accelerator` against `from accelerate import Accelerator`."""
    names = [n for n in SIDE_BY_SIDE if n == "accel" or importlib.util.find_spec(n)]
    if "accelerate" not in names:
        print("(accelerate not importable: run with --group bench to compare)")
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(runs):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            results[name].append(probe(SIDE_BY_SIDE[name], clock))
    print(f"side by side, {runs} interleaved runs each, {clock} clock:")
    print(f"  {'statement':<36} {'import torch':>13} {'adds':>10} {'ratio':>7} {'ratios (min-max)':>18}")  # fmt: skip
    ratios = {}
    for name in names:
        torch_s = statistics.median(t for t, _ in results[name])
        added_s = statistics.median(a for _, a in results[name])
        per_run = [(t + a) / t for t, a in results[name]]
        ratios[name] = statistics.median(per_run)
        spread = f"{min(per_run):.3f}-{max(per_run):.3f}"
        print(f"  {SIDE_BY_SIDE[name]:<36} {torch_s * 1e3:>10.0f} ms {added_s * 1e3:>7.1f} ms "
              f"{ratios[name]:>7.3f} {spread:>18}")  # fmt: skip
    verdict = "MET" if ratios["accel"] <= 1.03 else "MISSED"
    print(f"  target: accel within 1.03x of import torch: {ratios['accel']:.3f}  {verdict}")
    if "accelerate" in ratios:
        verdict = "MET" if ratios["accel"] <= ratios["accelerate"] else "MISSED"
        print(f"  target: accel at or under accelerate: {ratios['accel']:.3f} vs "
              f"{ratios['accelerate']:.3f}  {verdict}")  # fmt: skip


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    parser.add_argument("--skip-packages", action="store_true", help="side by side only")
    args = parser.parse_args()
    side_by_side(args.runs, args.clock)
    if args.skip_packages:
        return
    print(f"\neach package, {args.runs} runs, {args.clock} clock:")
    print(f"  {'package':<16} {'import torch':>13} {'package adds':>13} {'ratio':>7}")
    for name in PACKAGES:
        torch_s, package_s = measure(f"import {name}", args.runs, args.clock)
        ratio = (torch_s + package_s) / torch_s
        flag = "" if name == "accel" or ratio <= 1.05 else "  (over the 5% target)"
        print(
            f"  {name:<16} {torch_s * 1e3:>10.0f} ms {package_s * 1e3:>10.1f} ms {ratio:>7.3f}{flag}"
        )


if __name__ == "__main__":
    main()
