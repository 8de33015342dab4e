"""Benchmark accel-bigmodel loading and offloaded inference against raw PyTorch and accelerate.

    uv run --frozen --group bench python tools/bench/bench_bigmodel.py [--size-gb 1.5] [--shards 4]
        [--rounds 5]

Writes a sharded safetensors checkpoint of an MLP stack under /tmp, then runs each case in a
fresh process (so peak RSS is its own, and the page cache is warm for all of them):

  raw        safetensors.load_file per shard + load_state_dict(assign=True), first forward
  accel      load_checkpoint_and_dispatch(device_map="cpu"), first forward
  accelerate the same with HuggingFace accelerate (when installed)
  *-disk     device_map="auto" with max_memory sending most blocks to disk: load time, first
             forward, and steady forward time (ratio to the in-memory forward)
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
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def shape_for(size_gb: float, dim: int) -> int:
    per_block = (8 * dim * dim + 5 * dim) * 4
    return max(2, round(size_gb * 1e9 / per_block))


def write_checkpoint(folder: str, dim: int, layers: int, shards: int) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    names_per_shard = -(-layers // shards)
    weight_map = {}
    for s in range(shards):
        part = {}
        for i in range(s * names_per_shard, min(layers, (s + 1) * names_per_shard)):
            block = Block(dim)
            for name, tensor in block.state_dict().items():
                part[f"layers.{i}.{name}"] = tensor.contiguous()
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, file))
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def peak_rss() -> int:
    """This process's resident high-water mark (VmHWM: unlike ru_maxrss, reset by exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def steady(model: nn.Module, x: torch.Tensor, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        model(x)
    return (time.perf_counter() - start) / repeat


def run_case(case: str, folder: str, dim: int, layers: int, cpu_budget: int, repeat: int) -> dict:
    torch.set_grad_enabled(False)
    x = torch.randn(8, dim)
    base = peak_rss()
    result: dict = {}
    start = time.perf_counter()
    if case == "raw":
        from safetensors.torch import load_file

        with torch.device("meta"):
            model = Stack(dim, layers)
        state = {}
        for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            state.update(load_file(os.path.join(folder, file)))
        model.load_state_dict(state, assign=True)
        del state
    else:
        lib = case.split("-")[0]
        if lib == "accel":
            from accel_bigmodel import init_empty_weights, load_checkpoint_and_dispatch
        else:
            from accelerate import init_empty_weights, load_checkpoint_and_dispatch
        with init_empty_weights():
            model = Stack(dim, layers)
        if case.endswith("-disk"):
            offload = tempfile.mkdtemp(dir="/tmp", prefix="bench_offload_")
            kwargs = dict(
                device_map="auto", max_memory={"cpu": cpu_budget},
                no_split_module_classes=["Block"], offload_folder=offload,
            )  # fmt: skip
        else:
            kwargs = dict(device_map={"": "cpu"})
        model = load_checkpoint_and_dispatch(model, folder, **kwargs)
        result["load_s"] = time.perf_counter() - start
        if case.endswith("-disk"):
            devices = list(model.hf_device_map.values())
            result["blocks_on_disk"] = f"{devices.count('disk')}/{len(devices)}"
    model(x)
    result["load_and_first_forward_s"] = time.perf_counter() - start
    result["peak_rss_bytes"] = peak_rss()
    result["rss_before_bytes"] = base
    result["steady_forward_s"] = steady(model, x, repeat)
    if case.endswith("-disk"):
        shutil.rmtree(offload, ignore_errors=True)
    return result


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.5, help="checkpoint size (fp32)")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cpu-fraction", type=float, default=0.1, help="max_memory cpu share")
    parser.add_argument("--repeat", type=int, default=5, help="steady-state forwards")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every case this many times, interleaved; medians reported")  # fmt: skip
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers = shape_for(args.size_gb, args.dim)
    size = layers * (8 * args.dim * args.dim + 5 * args.dim) * 4
    cpu_budget = int(size * args.cpu_fraction)
    if args.case:
        out = run_case(args.case, args.folder, args.dim, layers, cpu_budget, args.repeat)
        print(json.dumps(out))
        return
    try:
        import accelerate

        others = ["accelerate", "accelerate-disk"]
        print(f"accelerate {accelerate.__version__} found: running it side by side")
    except ImportError:
        others = []
        print("accelerate not installed: comparing with raw PyTorch only")
    folder = tempfile.mkdtemp(dir="/tmp", prefix="bench_bigmodel_")
    try:
        write_checkpoint(folder, args.dim, layers, args.shards)
        print(f"checkpoint: {size / 1e9:.2f} GB, {layers} blocks of dim {args.dim}, "
              f"{args.shards} shards; disk cases keep {args.cpu_fraction:.0%} in RAM")  # fmt: skip
        runs: dict[str, list[dict]] = {}
        for _ in range(args.rounds):  # interleaved: machine noise hits every case alike
            for case in ["raw", "accel", *others[:1], "accel-disk", *others[1:]]:
                cmd = [sys.executable, __file__, "--case", case, "--folder", folder,
                       "--size-gb", str(args.size_gb), "--dim", str(args.dim),
                       "--cpu-fraction", str(args.cpu_fraction), "--repeat", str(args.repeat)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode:
                    print(f"{case}: failed\n{proc.stderr[-2000:]}")
                    continue
                runs.setdefault(case, []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
        results = {case: _median_run(got) for case, got in runs.items()}
        report(results, size)
        if args.rounds > 1 and "raw" in runs:
            print(
                f"\nload+first forward / raw's, per round ({args.rounds} rounds): median (min..max)"
            )
            for case, got in runs.items():
                if case == "raw" or len(got) != len(runs["raw"]):
                    continue
                ratios = [a["load_and_first_forward_s"] / b["load_and_first_forward_s"]
                          for a, b in zip(got, runs["raw"])]  # fmt: skip
                print(f"  {case:<16}{statistics.median(ratios):.3f}x "
                      f"({min(ratios):.3f}..{max(ratios):.3f})")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _median_run(got: list[dict]) -> dict:
    """Each number the median over the rounds (the other fields from the first round)."""
    out = dict(got[0])
    for key, value in got[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in got)
    return out


def report(results: dict, size: int) -> None:
    raw = results.get("raw")
    print(f"\n{'case':<18}{'load s':>9}{'load+fwd s':>12}{'vs raw':>8}{'+RSS GB':>13}"
          f"{'/model':>8}{'fwd ms':>9}{'vs mem':>8}")  # fmt: skip
    for case, r in results.items():
        total = r["load_and_first_forward_s"]
        ratio = f"{total / raw['load_and_first_forward_s']:.2f}x" if raw else "-"
        rss = (r["peak_rss_bytes"] - r["rss_before_bytes"]) / 1e9  # above imports
        fwd = r["steady_forward_s"]
        mem = f"{fwd / raw['steady_forward_s']:.2f}x" if raw else "-"
        load = f"{r['load_s']:.2f}" if "load_s" in r else "-"
        print(f"{case:<18}{load:>9}{total:>12.2f}{ratio:>8}{rss:>13.2f}"
              f"{rss * 1e9 / size:>8.2f}{fwd * 1e3:>9.1f}{mem:>8}")  # fmt: skip
        if "blocks_on_disk" in r:
            print(f"{'':<18}blocks on disk: {r['blocks_on_disk']}")
    for a, b in (("accel", "accelerate"), ("accel-disk", "accelerate-disk")):
        if a in results and b in results:
            ours, theirs = results[a], results[b]
            print(f"{a} vs {b}: load+first forward "
                  f"{ours['load_and_first_forward_s'] / theirs['load_and_first_forward_s']:.2f}x, "
                  f"steady forward {ours['steady_forward_s'] / theirs['steady_forward_s']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
