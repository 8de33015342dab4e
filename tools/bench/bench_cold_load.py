"""Checkpoint loading on a cold and a warm page cache: accel's readers against the disk's floor.

    uv run --frozen --group bench python tools/bench/bench_cold_load.py [--size-gb 1.5] [--rounds 3]
    # with the optional streamers:
    uv run --frozen --group bench --with runai-model-streamer --with fastsafetensors \\
        python tools/bench/bench_cold_load.py

Writes a sharded safetensors checkpoint of an MLP stack (bench_bigmodel's) under /tmp. Each
measurement runs in a fresh process and times load + first forward (the floor: reading the
files). In cold mode, before every measured process, only the checkpoint's own pages are evicted
(posix_fadvise DONTNEED on those files, after an fsync); the machine's other caches are left
alone. Variants are interleaved over rounds (the order rotates each round) and reported as the
median with the min..max spread:

  floor            the same files read front to back with 16 MiB reads into one reused buffer
  raw              safetensors.load_file per shard + load_state_dict(assign=True)
  accel            load_checkpoint_and_dispatch(device_map="cpu") (reader="auto": concurrent reads)
  accel-mmap       the same with reader="mmap" (safetensors' memory map, one tensor at a time)
  accel-disk       device_map="auto" with a small max_memory: most blocks stay on disk
  accelerate(-disk) HuggingFace accelerate, when importable (uv run --group bench)
  runai, fastsafetensors  accel with reader="runai" / "fastsafetensors", when installed
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_bigmodel import Stack, peak_rss, shape_for, write_checkpoint

_CHUNK = 16 * 2**20


def shard_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors"))


def evict(folder: str) -> None:
    """Drop the checkpoint's own pages from the page cache (nothing else)."""
    for path in shard_files(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_floor(folder: str) -> dict:
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    total = 0
    start = time.perf_counter()
    for path in shard_files(folder):
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                total += n
    return {"seconds": time.perf_counter() - start, "bytes": total}


def run_case(case: str, folder: str, dim: int, layers: int, cpu_budget: int) -> dict:
    if case == "floor":
        return run_floor(folder)
    torch.set_grad_enabled(False)
    x = torch.randn(8, dim)
    base = peak_rss()
    offload = None
    start = time.perf_counter()
    if case == "raw":
        from safetensors.torch import load_file

        with torch.device("meta"):
            model = Stack(dim, layers)
        state = {}
        for path in shard_files(folder):
            state.update(load_file(path))
        model.load_state_dict(state, assign=True)
        del state
    else:
        if case.startswith("accelerate"):
            from accelerate import init_empty_weights, load_checkpoint_and_dispatch

            kwargs: dict = {}
        else:
            from accel_bigmodel import init_empty_weights, load_checkpoint_and_dispatch

            reader = {"accel-mmap": "mmap", "runai": "runai", "fastsafetensors": "fastsafetensors"}
            kwargs = {"reader": reader.get(case, "auto")}
        with init_empty_weights():
            model = Stack(dim, layers)
        if case.endswith("-disk"):
            offload = tempfile.mkdtemp(dir="/tmp", prefix="bench_cold_offload_")
            kwargs.update(
                device_map="auto", max_memory={"cpu": cpu_budget},
                no_split_module_classes=["Block"], offload_folder=offload,
            )  # fmt: skip
        else:
            kwargs.update(device_map={"": "cpu"})
        model = load_checkpoint_and_dispatch(model, folder, **kwargs)
    model(x)
    seconds = time.perf_counter() - start
    if offload:
        shutil.rmtree(offload, ignore_errors=True)
    return {"seconds": seconds, "rss_bytes": peak_rss() - base}


def available_cases() -> list[str]:
    import importlib.util

    cases = ["floor", "raw", "accel", "accel-mmap", "accel-disk"]
    if importlib.util.find_spec("accelerate"):
        cases += ["accelerate", "accelerate-disk"]
    for case, module in (("runai", "runai_model_streamer"), ("fastsafetensors", "fastsafetensors")):
        if importlib.util.find_spec(module):
            cases.append(case)
    return cases


def measure(case: str, folder: str, args: argparse.Namespace, cold: bool) -> dict | None:
    if cold:
        evict(folder)
    cmd = [sys.executable, __file__, "--case", case, "--folder", folder, "--size-gb",
           str(args.size_gb), "--dim", str(args.dim), "--cpu-fraction", str(args.cpu_fraction)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        print(f"{case}: failed\n{proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.5, help="checkpoint size (fp32)")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cpu-fraction", type=float, default=0.1, help="max_memory cpu share")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers = shape_for(args.size_gb, args.dim)
    size = layers * (8 * args.dim * args.dim + 5 * args.dim) * 4
    if args.case:
        print(
            json.dumps(
                run_case(args.case, args.folder, args.dim, layers, int(size * args.cpu_fraction))
            )
        )
        return
    cases = available_cases()
    folder = tempfile.mkdtemp(dir="/tmp", prefix="bench_cold_load_")
    try:
        write_checkpoint(folder, args.dim, layers, args.shards)
        print(f"checkpoint: {size / 1e9:.2f} GB in {args.shards} shards; cases: {', '.join(cases)}")
        for mode in args.modes.split(","):
            results: dict[str, list[dict]] = {c: [] for c in cases}
            for r in range(args.rounds):
                order = cases[r % len(cases) :] + cases[: r % len(cases)]
                if mode == "warm":
                    run_floor(folder)  # everything in the cache before the round
                for case in order:
                    out = measure(case, folder, args, cold=mode == "cold")
                    if out:
                        results[case].append(out)
            report(mode, results, size)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(mode: str, results: dict[str, list[dict]], size: int) -> None:
    def median(case: str) -> float | None:
        runs = results.get(case) or []
        return statistics.median(r["seconds"] for r in runs) if runs else None

    floor, raw = median("floor"), median("raw")
    print(
        f"\n{mode} cache: load + first forward, median (min..max) of {len(results['floor'])} runs"
    )
    print("| case | seconds | spread | GB/s | vs floor | vs raw | +RSS / model |")
    print("|---|---|---|---|---|---|---|")
    for case, runs in results.items():
        if not runs:
            continue
        seconds = [r["seconds"] for r in runs]
        mid = statistics.median(seconds)
        vs_floor = f"{mid / floor:.2f}x" if floor else "-"
        vs_raw = f"{mid / raw:.2f}x" if raw else "-"
        rss = statistics.median(r.get("rss_bytes", 0) for r in runs) / size
        rss_text = f"{rss:.2f}" if case != "floor" else "-"
        print(f"| {case} | {mid:.2f} | {min(seconds):.2f}..{max(seconds):.2f} | "
              f"{size / mid / 1e9:.2f} | {vs_floor} | {vs_raw} | {rss_text} |")  # fmt: skip


if __name__ == "__main__":
    main()
