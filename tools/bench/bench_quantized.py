"""Quantized loading: time to the first output and peak memory, 8-bit and nf4 against float32.

    uv run --frozen python tools/bench/bench_quantized.py [--size-gb 1.5] [--rounds 2]

Writes a sharded float32 safetensors checkpoint of an MLP stack (bench_bigmodel's) under /tmp,
then, each in a fresh process, loads it and runs one forward:

  full     accel's load_checkpoint_and_dispatch(device_map="cpu"), float32
  int8     accel_bigmodel.quantization.load_and_quantize_model, bitsandbytes 8-bit
  nf4      the same, bitsandbytes 4-bit NormalFloat (compute in float32)
  accelerate-int8 / accelerate-nf4   HuggingFace accelerate's load_and_quantize_model, on a
           CUDA machine only (accelerate refuses to quantize without a GPU)

Every linear layer is quantized (skip_modules=[]). Reported per case (median over rounds, with
the min..max spread): the load, the first forward, their sum against the float32 load, the
quantized model's size (its tensors' bytes, statistics included), the process's peak resident
memory above what it held before the load (VmHWM), and that peak against the quantized size
and against the target "quantized size + one shard". The page cache is warm (the checkpoint
was just written); the first round's cold case is not separated out.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = ("full", "int8", "nf4")


def tensor_bytes(model) -> int:
    """Bytes of every tensor the model holds, quantization statistics included."""
    import torch

    total = 0
    for tensor in model.state_dict().values():
        if isinstance(tensor, torch.Tensor):
            total += tensor.numel() * tensor.element_size()
    return total


def run_case(case: str, folder: str, dim: int, layers: int) -> dict:
    """One load + first forward in this (fresh) process."""
    import torch
    from bench_bigmodel import Stack, peak_rss

    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if case.startswith("accelerate") else "cpu"
    if case != "full":
        import bitsandbytes  # noqa: F401  (imported before the baseline: it is not the model)
    base = peak_rss()
    start = time.perf_counter()
    if case == "full":
        from accel_bigmodel import init_empty_weights, load_checkpoint_and_dispatch

        with init_empty_weights():
            model = Stack(dim, layers)
        model = load_checkpoint_and_dispatch(model, folder, device_map="cpu")
    else:
        bits = case.rsplit("-", 1)[-1]
        if case.startswith("accelerate"):
            from accelerate import init_empty_weights
            from accelerate.utils import BnbQuantizationConfig, load_and_quantize_model
        else:
            from accel_bigmodel import init_empty_weights
            from accel_bigmodel.quantization import BnbQuantizationConfig, load_and_quantize_model
        if bits == "int8":
            config = BnbQuantizationConfig(
                load_in_8bit=True, torch_dtype=torch.float32, skip_modules=[]
            )
        else:
            config = BnbQuantizationConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.float32, torch_dtype=torch.float32, skip_modules=[],
            )  # fmt: skip
        with init_empty_weights():
            model = Stack(dim, layers)
        model = load_and_quantize_model(model, config, folder, device_map={"": device})
    loaded = time.perf_counter() - start
    x = torch.randn(8, dim, device=device)
    with torch.no_grad():
        model(x)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - start - loaded
    return {
        "load": loaded,
        "forward": first,
        "rss_bytes": peak_rss() - base,
        "model_bytes": tensor_bytes(model),
    }


def measure(case: str, folder: str, args: argparse.Namespace) -> dict | None:
    code = (
        f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"import bench_quantized as b; "
        f"print(json.dumps(b.run_case({case!r}, {folder!r}, {args.dim}, {args.layers})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{case}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    from bench_bigmodel import shape_for, write_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.5)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.layers = shape_for(args.size_gb, args.dim)
    cases = list(CASES)
    try:
        import torch

        if torch.cuda.is_available():
            import accelerate  # noqa: F401

            cases += ["accelerate-int8", "accelerate-nf4"]
    except ImportError:
        pass
    folder = tempfile.mkdtemp(prefix="bench_quantized_")
    try:
        write_checkpoint(folder, args.dim, args.layers, args.shards)
        files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
        sizes = [os.path.getsize(os.path.join(folder, f)) for f in files]
        results: dict[str, list[dict]] = {c: [] for c in cases}
        for round_ in range(args.rounds):
            order = cases[round_ % len(cases) :] + cases[: round_ % len(cases)]
            for case in order:
                result = measure(case, folder, args)
                if result is not None:
                    results[case].append(result)
        report(results, sum(sizes), max(sizes), args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(results: dict[str, list[dict]], size: int, shard: int, args) -> None:
    def median(case: str, key: str) -> float:
        return statistics.median(r[key] for r in results[case])

    def spread(case: str, key: str) -> str:
        values = [r[key] for r in results[case]]
        return f"{min(values):.2f}..{max(values):.2f}"

    load = os.getloadavg()
    print(
        f"\ncheckpoint: {size / 1e9:.2f} GB float32 in {args.shards} shards (largest "
        f"{shard / 1e9:.2f} GB), Stack(dim={args.dim}, layers={args.layers}); "
        f"{os.cpu_count()} CPUs; load average {load[0]:.1f}; {args.rounds} rounds, warm cache"
    )
    print(
        "| case | load s | first forward s | load+forward s (min..max) | vs full | model GB "
        "| peak RSS GB | peak / model | peak / (model + shard) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    full = median("full", "load") + median("full", "forward") if results.get("full") else None
    for case, runs in results.items():
        if not runs:
            continue
        for r in runs:
            r["total"] = r["load"] + r["forward"]
        total, model = median(case, "total"), median(case, "model_bytes")
        rss = median(case, "rss_bytes")
        ratio = f"{total / full:.2f}" if full else "-"
        print(
            f"| {case} | {median(case, 'load'):.2f} | {median(case, 'forward'):.3f} | "
            f"{total:.2f} ({spread(case, 'total')}) | {ratio} | {model / 1e9:.3f} | "
            f"{rss / 1e9:.3f} | {rss / model:.2f} | {rss / (model + shard):.2f} |"
        )


if __name__ == "__main__":
    main()
