"""Checkpoint loading on a cold and a warm page cache: accel's readers against the disk's floor.

    uv run --frozen --group bench python tools/bench/bench_cold_load.py [--size-gb 1.5] [--rounds 3]
    # with the optional streamers:
    uv run --frozen --group bench --with runai-model-streamer --with fastsafetensors \\
        python tools/bench/bench_cold_load.py

Writes a sharded safetensors checkpoint of an MLP stack (bench_bigmodel's) under /tmp. Each
measurement runs in a fresh process and records the time the load call returns, the time to the
first output (load + first forward; for the floors: reading the files) and the process's CPU
time (user + system). In cold mode, before every measured process, only the checkpoint's own
pages are evicted (posix_fadvise DONTNEED on those files, after an fsync); the machine's other
caches are left alone. Variants are interleaved over rounds (the order rotates each round) and
reported as the median with the min..max spread:

  floor            the same files read front to back with 16 MiB reads into one reused buffer
  par-TxM          T threads reading M MiB pieces of the files (os.preadv into one reused buffer
                   per thread); the best of this small sweep is the parallel floor, which every
                   case is reported against
  raw              safetensors.load_file per shard + load_state_dict(assign=True)
  accel            load_checkpoint_and_dispatch(device_map="cpu") (reader="auto")
  accel-wait       the same, but the load reads everything before it returns (overlap=False)
  accel-read       reader=CheckpointReader(map_cached=False): concurrent reads into new tensors
  accel-mmap       accel with reader="mmap" (safetensors' memory map, one tensor at a time)
  accel-disk       device_map="auto" with a small max_memory: most blocks stay on disk
  *-bf16           raw, accel and accelerate loading the fp32 checkpoint as bf16 (dtype=): every
                   tensor changes dtype, so accel reads it into new memory and converts it
  accelerate(-disk) HuggingFace accelerate, when importable (uv run --group bench)
  runai, fastsafetensors  accel with reader="runai" / "fastsafetensors", when installed

The rule reader="auto" follows (map what stays on the host in its stored dtype and fault cold
pages in with threads; read into new tensors only what changes dtype or device) is checked at
the end: auto must be within 10% of the fastest accel path (accel-read, accel-mmap) here, and
accel-bf16 within 10% of accel-mmap-bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
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


def run_parallel(folder: str, threads: int, piece: int) -> dict:
    """`threads` threads read the files in `piece`-byte preadv calls into their own buffers."""
    jobs = [
        (path, offset, min(piece, os.path.getsize(path) - offset))
        for path in shard_files(folder)
        for offset in range(0, os.path.getsize(path), piece)
    ]
    lock, total = threading.Lock(), [0]
    start = time.perf_counter()

    def work() -> None:
        view, fds = memoryview(bytearray(piece)), {}
        try:
            while True:
                with lock:
                    if not jobs:
                        break
                    path, offset, length = jobs.pop(0)
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY)
                n = os.preadv(fds[path], [view[:length]], offset)
                with lock:
                    total[0] += n
        finally:
            for fd in fds.values():
                os.close(fd)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"seconds": time.perf_counter() - start, "bytes": total[0]}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_case(case: str, folder: str, dim: int, layers: int, cpu_budget: int) -> dict:
    cpu = cpu_seconds()
    if case == "floor" or case.startswith("par-"):
        if case == "floor":
            out = run_floor(folder)
        else:
            threads, mib = case.removeprefix("par-").split("x")
            out = run_parallel(folder, int(threads), int(mib) * 2**20)
        return {**out, "load": out["seconds"], "cpu": cpu_seconds() - cpu}
    torch.set_grad_enabled(False)
    dtype = torch.bfloat16 if case.endswith("-bf16") else torch.float32
    case = case.removesuffix("-bf16")
    x = torch.randn(8, dim, dtype=dtype)
    base = peak_rss()
    offload = None
    start = time.perf_counter()
    if case == "raw":
        from safetensors.torch import load_file

        with torch.device("meta"):
            model = Stack(dim, layers)
        state = {}
        for path in shard_files(folder):
            state.update({k: v.to(dtype) for k, v in load_file(path).items()})
        model.load_state_dict(state, assign=True)
        del state
    else:
        if case.startswith("accelerate"):
            from accelerate import init_empty_weights, load_checkpoint_and_dispatch

            kwargs: dict = {}
        else:
            from accel_bigmodel import (
                CheckpointReader,
                init_empty_weights,
                load_checkpoint_and_dispatch,
            )

            reader = {
                "accel-mmap": "mmap", "runai": "runai", "fastsafetensors": "fastsafetensors",
                "accel-wait": CheckpointReader(overlap=False),
                "accel-read": CheckpointReader(map_cached=False),
            }  # fmt: skip
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
        if dtype != torch.float32:
            kwargs["dtype"] = dtype
        model = load_checkpoint_and_dispatch(model, folder, **kwargs)
    loaded = time.perf_counter() - start
    model(x)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    if offload:
        shutil.rmtree(offload, ignore_errors=True)
    return {"seconds": seconds, "load": loaded, "cpu": cpu, "rss_bytes": peak_rss() - base}


def available_cases(sweep: str) -> list[str]:
    import importlib.util

    cases = ["floor", *(f"par-{p}" for p in sweep.split(",") if p)]
    cases += ["raw", "accel", "accel-wait", "accel-read", "accel-mmap", "accel-disk"]
    cases += ["raw-bf16", "accel-bf16", "accel-mmap-bf16"]
    if importlib.util.find_spec("accelerate"):
        cases += ["accelerate", "accelerate-disk", "accelerate-bf16"]
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
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.5, help="checkpoint size (fp32)")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cpu-fraction", type=float, default=0.1, help="max_memory cpu share")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument(
        "--sweep", default="2x8,4x8,8x8,4x32", help="parallel floor: THREADSxMiB, comma separated"
    )
    parser.add_argument("--cases", help="comma-separated subset of the cases (default: all)")
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
    cases = available_cases(args.sweep)
    if args.cases:
        cases = [c for c in cases if c in args.cases.split(",") or c.startswith("par-")]
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
    def median(case: str, key: str = "seconds") -> float | None:
        runs = results.get(case) or []
        return statistics.median(r[key] for r in runs) if runs else None

    sweep = {c: median(c) for c in results if c.startswith("par-") and results[c]}
    best = min(sweep, key=lambda c: sweep[c]) if sweep else None
    floor = sweep[best] if best else median("floor")
    raw = median("raw")
    rounds = max(map(len, results.values()))
    print(
        f"\n{mode} cache: median (min..max) of {rounds} runs; parallel floor = {best} "
        f"({floor:.2f} s)"
    )
    print(
        "| case | first output, s | spread | load returns, s | GB/s | vs parallel floor | "
        "vs raw | CPU s | CPU s/GB | +RSS / model |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case, runs in results.items():
        if not runs:
            continue
        seconds = [r["seconds"] for r in runs]
        mid = statistics.median(seconds)
        vs_floor = f"{mid / floor:.2f}x" if floor else "-"
        base = median("raw-bf16") if case.endswith("-bf16") else raw  # like against like
        vs_raw = f"{mid / base:.2f}x" if base else "-"
        cpu = median(case, "cpu")
        rss = statistics.median(r.get("rss_bytes", 0) for r in runs) / size
        rss_text = f"{rss:.2f}" if "rss_bytes" in runs[0] else "-"
        print(f"| {case} | {mid:.2f} | {min(seconds):.2f}..{max(seconds):.2f} | "
              f"{median(case, 'load'):.2f} | {size / mid / 1e9:.2f} | {vs_floor} | {vs_raw} | "
              f"{cpu:.2f} | {cpu / (size / 1e9):.2f} | {rss_text} |")  # fmt: skip
    rules = (("accel", ("accel-read", "accel-mmap")), ("accel-bf16", ("accel-mmap-bf16",)))
    for auto_case, others in rules:
        paths = {c: median(c) for c in others if results.get(c)}
        auto = median(auto_case)
        if not (auto and paths):
            continue
        fastest = min(paths, key=lambda c: paths[c])
        verdict = "holds" if auto <= 1.1 * paths[fastest] else "does NOT hold"
        print(
            f"\nreader='auto' rule {verdict} here ({auto_case}): auto {auto:.2f} s, fastest "
            f"other accel path {fastest} {paths[fastest]:.2f} s"
        )


if __name__ == "__main__":
    main()
