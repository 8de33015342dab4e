"""Import cost of each accel package over `import torch`, in fresh interpreters.

Each run is a new interpreter that times `import torch` and then `import <package>`
(torch already loaded), so the second number is what the package itself adds. Prints the
median over --runs runs and the ratio (torch + package) / torch. Target: under 1.05 for
every leaf package.

    uv run python tools/bench/bench_import.py [--runs 7]
"""

from __future__ import annotations

import argparse
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
PROBE = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import {name}
t2 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1]))
"""


def measure(name: str, runs: int) -> tuple[float, float]:
    torch_times, package_times = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(name=name)],
            capture_output=True,
            text=True,
            check=True,
        )
        torch_s, package_s = json.loads(out.stdout.strip().splitlines()[-1])
        torch_times.append(torch_s)
        package_times.append(package_s)
    return statistics.median(torch_times), statistics.median(package_times)


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"{'package':<16} {'import torch':>13} {'package adds':>13} {'ratio':>7}")
    for name in PACKAGES:
        torch_s, package_s = measure(name, args.runs)
        ratio = (torch_s + package_s) / torch_s
        flag = "" if name == "accel" or ratio <= 1.05 else "  (over the 5% target)"
        print(
            f"{name:<16} {torch_s * 1e3:>10.0f} ms {package_s * 1e3:>10.1f} ms {ratio:>7.3f}{flag}"
        )


if __name__ == "__main__":
    main()
