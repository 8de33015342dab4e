"""Benchmark loading a checkpoint from an object store (s3://) against a raw read of its bytes.

    uv run --frozen --group bench python tools/bench/bench_store_load.py [--size-mib 512]
        [--shards 4] [--rounds 3]

Writes a sharded safetensors checkpoint of an MLP stack under /tmp, starts moto's S3 server
(accel_testkit.s3, a separate process on loopback) and uploads the checkpoint to a bucket,
then runs each case in a fresh process (peak RSS is its own), interleaved over the rounds:

  raw    s3fs ``fs.cat`` of every shard at once: the bytes alone, no tensor made (s3fs
         fetches each object in concurrent 50 MiB ranged GETs)
  raw-1get  the same with one GET per shard, all at once (``fs.cat_ranges``): on moto, the
         floor (see below)
  accel  ``load_checkpoint_and_dispatch(model, "s3://.../ckpt", device_map={"": "cpu"})``
         (headers and tensors by concurrent ranged reads, within the reader's buffer)
  local  the same from the local folder (page cache warm)

Each case's clock starts once fsspec, s3fs and accel_bigmodel are imported. Prints each
case's median seconds and peak RSS (and the RSS when its clock started), and raw / accel for
both raw cases (1.0: as fast as the raw read; the target is 0.8 or more). moto answers a
ranged GET by reading the whole object on its side and slicing it, so every request costs the
server a pass over its shard (a cost real S3 does not have): fewer, larger requests win here,
which is why raw-1get is the floor on this server and s3fs's own ``fs.cat`` is not.
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
from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)


class Stack(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))


def shape_for(size_mib: float, dim: int) -> int:
    per_block = (8 * dim * dim + 5 * dim) * 4
    return max(2, round(size_mib * 2**20 / per_block))


def write_checkpoint(folder: str, dim: int, layers: int, shards: int) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    per_shard = -(-layers // shards)
    weight_map = {}
    for s in range(shards):
        part = {}
        for i in range(s * per_shard, min(layers, (s + 1) * per_shard)):
            for name, tensor in Block(dim).state_dict().items():
                part[f"layers.{i}.{name}"] = tensor.contiguous()
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, file))
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_case(case: str, source: str, dim: int, layers: int) -> dict:
    import fsspec
    import s3fs  # noqa: F401 (imported before the clock starts, in every case)

    from accel_bigmodel import init_empty_weights, load_checkpoint_and_dispatch

    before = peak_rss()
    start = time.perf_counter()
    if case == "raw":
        fs, path = fsspec.core.url_to_fs(source)
        shards = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".safetensors"))
        data = fs.cat(shards)  # s3fs: each object in concurrent 50 MiB ranged GETs
        nbytes = sum(len(v) for v in data.values())
        del data
    elif case == "raw-1get":
        fs, path = fsspec.core.url_to_fs(source)
        shards = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".safetensors"))
        sizes = [fs.size(p) for p in shards]
        data = fs.cat_ranges(shards, [0] * len(shards), sizes)  # one GET per object, at once
        nbytes = sum(len(v) for v in data)
        del data
    else:
        with init_empty_weights():
            model = Stack(dim, layers)
        model = load_checkpoint_and_dispatch(model, source, device_map={"": "cpu"})
        nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        assert all(t.device.type == "cpu" for t in model.state_dict().values())
    seconds = time.perf_counter() - start
    return {"s": seconds, "bytes": nbytes, "peak_rss_bytes": peak_rss(), "rss_before": before}


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=512, help="checkpoint size (fp32)")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved; medians reported")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers = shape_for(args.size_mib, args.dim)
    if args.case:
        print(json.dumps(run_case(args.case, args.source, args.dim, layers)))
        return
    from accel_bigmodel import stores
    from accel_testkit.s3 import serve_s3

    folder = tempfile.mkdtemp(dir="/tmp", prefix="bench_store_load_")
    try:
        write_checkpoint(folder, args.dim, layers, args.shards)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(f"checkpoint: {size / 2**20:.0f} MiB, {layers} blocks of dim {args.dim}, "
              f"{args.shards} shards")  # fmt: skip
        with serve_s3([], "127.0.0.1") as server:
            bucket = server.bucket("bench")
            url = stores.join(bucket, "ckpt")
            with server.environment():
                stores.upload(Path(folder), url)
            env = {**os.environ, **server.env}
            sources = {"raw": url, "raw-1get": url, "accel": url, "local": folder}
            runs: dict[str, list[dict]] = {case: [] for case in sources}
            for _ in range(args.rounds):
                for case, source in sources.items():
                    cmd = [sys.executable, __file__, "--case", case, "--source", source,
                           "--size-mib", str(args.size_mib), "--dim", str(args.dim)]  # fmt: skip
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                    if proc.returncode:
                        print(f"{case}: failed\n{proc.stderr[-2000:]}")
                        continue
                    runs[case].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        report(runs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(runs: dict[str, list[dict]]) -> None:
    print(f"\n{'case':<8}{'seconds (median)':>18}{'all rounds':>26}{'MiB/s':>9}"
          f"{'peak RSS (before the clock)':>30}")  # fmt: skip
    medians = {}
    for case, got in runs.items():
        if not got:
            continue
        seconds = [r["s"] for r in got]
        medians[case] = statistics.median(seconds)
        rss = max(r["peak_rss_bytes"] for r in got) / 2**20
        base = max(r["rss_before"] for r in got) / 2**20
        rate = got[0]["bytes"] / 2**20 / medians[case]
        listed = " ".join(f"{s:.2f}" for s in seconds)
        print(f"{case:<8}{medians[case]:>18.3f}{listed:>26}{rate:>9.0f}"
              f"{f'{rss:.0f} MiB ({base:.0f} MiB)':>30}")  # fmt: skip
    for raw in ("raw", "raw-1get"):
        if raw in medians and "accel" in medians:
            ratio = medians[raw] / medians["accel"]
            per_round = [r["s"] / a["s"] for r, a in zip(runs[raw], runs["accel"])]
            print(f"\n{raw} / accel: {ratio:.3f} (target >= 0.8); per round: "
                  f"{' '.join(f'{x:.3f}' for x in per_round)}")  # fmt: skip


if __name__ == "__main__":
    main()
