"""CUDA offload and loading: offloaded inference with prefetch, and checkpoint loading to a GPU.

    python tools/bench/bench_offload.py [--dim 4096] [--blocks 8] [--tokens 2048 8192 32768]
        [--load-gb 4] [--repeat 5]

Part 1, offloaded forward. A stack of `--blocks` bf16 MLP blocks (Linear(d, 4d), GELU,
Linear(4d, d)), forward only, at several token counts. It first measures, per block, the
pinned host-to-device copy time of its weights and its compute time on the GPU, so each row
says whether the copy fits under the compute. Variants (median forward time over `--repeat`
forwards, after two that learn the order):

  gpu               the whole model on the GPU (the baseline)
  accel cpu+pf      accel_bigmodel.cpu_offload (pinned weights, side-stream prefetch)
  accel cpu         cpu_offload(prefetch=False)
  accel disk+pf     disk_offload with prefetch (files in the page cache after the first pass)
  accelerate cpu    HuggingFace accelerate's cpu_offload (when installed)

Target: accel cpu+pf within 1.15x of gpu where the copy takes at most the compute time.

Part 2, loading a `--load-gb` bf16 checkpoint (4 safetensors shards) onto the GPU, each case
in a fresh process, page cache warm (median of 3 runs): raw safetensors ``load_file(device=
"cuda")`` + ``load_state_dict(assign=True)``, accel and accelerate
``load_checkpoint_and_dispatch(device_map={"": 0}, dtype=torch.bfloat16)``; then the first
forward.
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
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, dim: int, blocks: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def make_stack(dim: int, blocks: int) -> Stack:
    torch.manual_seed(0)
    model = Stack(dim, blocks).to(torch.bfloat16)
    with torch.no_grad():  # keep activations of a deep residual stack in range
        for p in model.parameters():
            p.mul_(0.5)
    return model.eval()


def cuda_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def per_block(dim: int, tokens: int) -> tuple[float, float]:
    """(pinned host-to-device copy ms, compute ms) of one block."""
    block = Block(dim).to(torch.bfloat16)
    pinned = [p.detach().pin_memory() for p in block.parameters()]
    dev = [torch.empty_like(p, device="cuda") for p in pinned]

    def copy() -> None:
        for d, p in zip(dev, pinned):
            d.copy_(p, non_blocking=True)

    copy_ms = cuda_ms(copy, 5)
    block = block.cuda()
    x = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compute_ms = cuda_ms(lambda: block(x), 5)
    return copy_ms, compute_ms


def offload_case(variant: str, dim: int, blocks: int, tokens: int, repeat: int) -> dict:
    torch.set_grad_enabled(False)
    model = make_stack(dim, blocks)
    x = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
    folder = None
    if variant == "gpu":
        model = model.cuda()
    elif variant.startswith("accel "):
        from accel_bigmodel import cpu_offload, disk_offload

        if variant.startswith("accel disk"):
            folder = tempfile.mkdtemp(prefix="bench_offload_")
            disk_offload(model, folder, execution_device=0, prefetch=True)
        else:
            cpu_offload(model, execution_device=0, prefetch=variant.endswith("+pf"))
    else:
        from accelerate import cpu_offload

        cpu_offload(model, execution_device=0)
    try:
        out = model(x)
        model(x)  # the first forward learns the order of the blocks
        ms = cuda_ms(lambda: model(x), repeat)
        check = out.float().norm().item()
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    return {"ms": ms, "check": check, "peak_gb": torch.cuda.max_memory_allocated() / 1e9}


def load_case(case: str, folder: str, dim: int, blocks: int) -> dict:
    torch.set_grad_enabled(False)
    x = torch.randn(16, dim, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    if case == "raw":
        from safetensors.torch import load_file

        with torch.device("meta"):
            model = Stack(dim, blocks)
        state = {}
        for name in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            state.update(load_file(os.path.join(folder, name), device="cuda"))
        model.load_state_dict(state, assign=True)
        del state
    else:
        if case == "accel":
            from accel_bigmodel import init_empty_weights, load_checkpoint_and_dispatch
        else:
            from accelerate import init_empty_weights, load_checkpoint_and_dispatch
        with init_empty_weights():
            model = Stack(dim, blocks)
        model = load_checkpoint_and_dispatch(
            model, folder, device_map={"": 0}, dtype=torch.bfloat16
        )
    torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    out = model(x)
    torch.cuda.synchronize()
    return {
        "load_s": load_s,
        "load_fwd_s": time.perf_counter() - start,
        "check": out.float().norm().item(),
    }


def write_checkpoint(folder: str, dim: int, blocks: int, shards: int) -> None:
    from safetensors.torch import save_file

    model = make_stack(dim, blocks)
    state = model.state_dict()
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = {n: state[n].contiguous() for n in names[s * per : (s + 1) * per]}
        if not part:
            continue
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, os.path.join(folder, file))
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def child(args: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    from _bytecode import compile_workspace

    compile_workspace()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768])
    p.add_argument("--load-gb", type=float, default=4.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--skip-load", action="store_true", help="part 1 only")
    p.add_argument("--skip-offload", action="store_true", help="part 2 only")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        kind, _, rest = args.case.partition(":")
        if kind == "offload":
            variant, tokens = rest.rsplit("@", 1)
            out = offload_case(variant, args.dim, args.blocks, int(tokens), args.repeat)
        else:
            out = load_case(rest, args.folder, args.dim, args.blocks)
        print(json.dumps(out))
        return 0
    if not torch.cuda.is_available():
        print("bench_offload: no CUDA GPU is visible. Skipped.")
        return 0
    try:
        import accelerate

        hf = True
        print(f"accelerate {accelerate.__version__} found: running it side by side")
    except ImportError:
        hf = False
    block_gb = 8 * args.dim * args.dim * 2 / 1e9
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"offload: {args.blocks} blocks of dim {args.dim}, {block_gb:.2f} GB each (bf16)")
    variants = ["gpu", "accel cpu+pf", "accel cpu", "accel disk+pf"]
    variants += ["accelerate cpu"] if hf else []
    header = f"{'tokens':>7}{'copy ms':>9}{'compute':>9}" + "".join(f"{v:>16}" for v in variants)
    if not args.skip_offload:
        print(header + "   (ms per forward, x of gpu)")
    for tokens in [] if args.skip_offload else args.tokens:
        copy_ms, compute_ms = per_block(args.dim, tokens)
        row = f"{tokens:>7}{copy_ms:>9.2f}{compute_ms:>9.2f}"
        base = None
        for variant in variants:
            r = child(["--case", f"offload:{variant}@{tokens}", "--dim", str(args.dim),
                       "--blocks", str(args.blocks), "--repeat", str(args.repeat)])  # fmt: skip
            if "error" in r:
                row += f"{'failed':>16}"
                print(f"  {variant} @ {tokens}: {r['error']}")
                continue
            base = r["ms"] if variant == "gpu" else base
            ratio = f" {r['ms'] / base:4.2f}x" if base else ""
            row += f"{r['ms']:>10.1f}{ratio:>6}"
        print(row, flush=True)
    if args.skip_load:
        return 0
    blocks = max(1, round(args.load_gb / block_gb))
    folder = tempfile.mkdtemp(prefix="bench_load_")
    try:
        write_checkpoint(folder, args.dim, blocks, 4)
        size = blocks * block_gb
        print(f"\nload to cuda:0: {size:.2f} GB bf16 checkpoint, {blocks} blocks, 4 shards, "
              f"page cache warm; median of 3 fresh processes")  # fmt: skip
        cases = ["raw", "accel"] + (["accelerate"] if hf else [])
        results: dict[str, list[dict]] = {c: [] for c in cases}
        for _ in range(3):
            for case in cases:
                results[case].append(child(["--case", f"load:{case}", "--folder", folder,
                                            "--dim", str(args.dim), "--blocks", str(blocks)]))  # fmt: skip
        raw_total = None
        for case, runs in results.items():
            ok = [r for r in runs if "error" not in r]
            if not ok:
                print(f"  {case:<11} failed: {runs[0]['error']}")
                continue
            load = statistics.median(r["load_s"] for r in ok)
            total = statistics.median(r["load_fwd_s"] for r in ok)
            raw_total = total if case == "raw" else raw_total
            ratio = f"{total / raw_total:.2f}x raw" if raw_total else ""
            print(f"  {case:<11} load {load:6.2f} s  load+first forward {total:6.2f} s  "
                  f"{size / load:5.2f} GB/s  {ratio}")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
