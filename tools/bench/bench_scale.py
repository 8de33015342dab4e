"""accel's control plane at 8 to 16,384 ranks, by simulation: a table of N against each path.

Each path runs accel's real code for one or a few ranks of a world of N, with the rest of the
world simulated (torch's fake process group, a real TCPStore, lightweight clients on loopback,
per-rank plans from the real sharding rules); the modules that measure them say how
(`_scale_control.py`: launch, preflight, rendezvous, hang doctor; `_scale_checkpoint.py`:
checkpoint planning and commit, the data position, step metrics, estimate-memory).

Every path reports, at each N, what it can measure of: the time on the coordinator, the time
per rank, bytes, store operations, files and probes. The slope printed beside a figure is the
exponent b of cost ~ N^b between the two largest N that path ran at: the targets are b <= 1
on the coordinator (linear) and a per-rank cost that grows no faster than log N (b near 0).

    uv run python tools/bench/bench_scale.py                    # every path, every N
    uv run python tools/bench/bench_scale.py --ns 8 64 --paths preflight
    uv run python tools/bench/bench_scale.py --json out.json     # also write the rows
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_NS = (8, 64, 512, 4096, 16384)
MODULES = ("_scale_control", "_scale_checkpoint")
METRICS = ("coordinator_s", "per_rank_s", "bytes", "store_ops", "files", "probes")
# A path measures one world size N and returns {metric: value, ..., "note": str}; a metric it
# cannot measure is absent. LIMITS caps N where a path cannot run larger on one machine.
Measure = Callable[[int], dict[str, Any]]


def _paths() -> tuple[dict[str, Measure], dict[str, int]]:
    paths: dict[str, Measure] = {}
    limits: dict[str, int] = {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        paths.update(module.PATHS)
        limits.update(getattr(module, "LIMITS", {}))
    return paths, limits


def slope(points: list[tuple[int, float]]) -> float | None:
    """The exponent b of value ~ N^b between the two largest N with positive values."""
    points = [(n, v) for n, v in points if v is not None and v > 0]
    if len(points) < 2:
        return None
    (n0, v0), (n1, v1) = sorted(points)[-2:]
    return math.log(v1 / v0) / math.log(n1 / n0)


def _cell(metric: str, value: Any) -> str:
    if value is None:
        return "-"
    if metric.endswith("_s"):
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
    if metric == "bytes" and value >= 10_000:
        return f"{value / 1e6:.2f} MB"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="+", default=list(DEFAULT_NS))
    parser.add_argument("--paths", nargs="+", help="the paths to run (default: all)")
    parser.add_argument("--json", type=Path, help="write every row to this file")
    args = parser.parse_args(argv)
    paths, limits = _paths()
    chosen = args.paths or list(paths)
    unknown = sorted(set(chosen) - set(paths))
    if unknown:
        parser.error(f"unknown path(s) {unknown}; known: {sorted(paths)}")
    rows: list[dict[str, Any]] = []
    for path in chosen:
        for n in args.ns:
            if n > limits.get(path, max(args.ns)):
                continue
            started = time.perf_counter()
            row = {"path": path, "n": n, **paths[path](n)}
            row["wall_s"] = time.perf_counter() - started
            rows.append(row)
            cells = "  ".join(f"{m}={_cell(m, row[m])}" for m in METRICS if m in row)
            print(f"{path:<28} N={n:<6} {cells}  {row.get('note', '')}", flush=True)
    print("\nslopes (b in cost ~ N^b between the two largest N):")
    for path in chosen:
        mine = [r for r in rows if r["path"] == path]
        parts = []
        for metric in METRICS:
            b = slope([(r["n"], r.get(metric)) for r in mine])
            if b is not None:
                parts.append(f"{metric} {b:+.2f}")
        print(f"  {path:<28} {', '.join(parts) or '(one N only)'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
