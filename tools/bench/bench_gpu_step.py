"""Step time on a CUDA GPU: accel's Accelerator against a raw CUDA loop and HuggingFace accelerate.

    python tools/bench/bench_gpu_step.py [--steps 200] [--rounds 7] [--modes no fp16 bf16]

For each precision mode (fp32, fp16 with a GradScaler, bf16 autocast) and two models, one
training step written as users write it:

- raw:        autocast + ``torch.amp.GradScaler`` (fp16) + ``loss.backward(); opt.step()`` by hand;
- accel:      ``accel.Accelerator(mixed_precision=...)``: ``acc.backward(loss); opt.step()`` on
              what ``prepare`` returned;
- accelerate: the same loop with ``accelerate.Accelerator`` (when importable).

Models: `small` (3 x Linear(256, 256), batch 64: the GPU finishes each kernel in microseconds,
so the host's per-step cost is what shows) and `large` (4 x Linear(4096, 4096), batch 8192:
compute-bound). Each round runs every variant for `--steps` steps in a rotated order; the table
gives the median milliseconds per step over the rounds (wall clock around the steps, with a
synchronize at both ends) and the ratio to raw. Before timing, the warm-up checks that each
variant trained its copy of the model like raw (fp32: equal to 1e-5; fp16/bf16: close).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

MODELS = {"small": (256, 3, 64), "large": (4096, 4, 8192)}  # width, layers, batch


def make_model(kind: str) -> nn.Module:
    width, layers, _ = MODELS[kind]
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 16))


def make_batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    width, _, batch = MODELS[kind]
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(batch, width, device="cuda", generator=g)
    return x, torch.randn(batch, 16, device="cuda", generator=g)


def raw_variant(kind: str, mode: str) -> tuple[nn.Module, Callable[[], None]]:
    model = make_model(kind).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = make_batch(kind)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mode)
    scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def accelerator_variant(lib: str) -> Callable[[str, str], tuple[nn.Module, Callable[[], None]]]:
    def build(kind: str, mode: str) -> tuple[nn.Module, Callable[[], None]]:
        if lib == "accel":
            from accel import Accelerator, AcceleratorState
        else:
            from accelerate import Accelerator
            from accelerate.state import AcceleratorState
        AcceleratorState._reset_state()  # each case asks for its own mixed precision
        acc = Accelerator(mixed_precision=mode)
        model = make_model(kind)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt = acc.prepare(model, opt)
        x, y = make_batch(kind)

        def step() -> None:
            loss = nn.functional.mse_loss(model(x).float(), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return model, step

    return build


def time_steps(step: Callable[[], None], steps: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def max_difference(a: nn.Module, b: nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa)


def run(kind: str, mode: str, args: argparse.Namespace, hf: bool) -> dict[str, float]:
    builders = {"raw": raw_variant, "accel": accelerator_variant("accel")}
    if hf:
        builders["accelerate"] = accelerator_variant("accelerate")
    built = {}
    for name, build in builders.items():
        built[name] = build(kind, mode)
        for _ in range(args.warmup):
            built[name][1]()
    raw_model = built["raw"][0]
    tolerance = 1e-5 if mode == "no" else 5e-2
    for name, (model, _) in built.items():
        unwrapped = getattr(model, "module", model)
        diff = max_difference(raw_model, unwrapped)
        if diff > tolerance:
            print(f"  warning: {name} weights differ from raw by {diff:.2e} after warm-up")
    times: dict[str, list[float]] = {name: [] for name in built}
    names = list(built)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(time_steps(built[name][1], args.steps))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="steps per round (large: a tenth)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--modes", nargs="+", default=["no", "fp16", "bf16"])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu_step: no CUDA GPU is visible. Skipped.")
        return 0
    try:
        import accelerate

        hf = True
        print(f"accelerate {accelerate.__version__} found: running it side by side")
    except ImportError:
        hf = False
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'model':<7}{'mode':<6}{'raw ms':>9}{'accel ms':>10}{'x raw':>7}"
          f"{'accelerate ms':>15}{'x raw':>7}")  # fmt: skip
    steps = args.steps
    for kind in args.models:
        args.steps = steps if kind == "small" else max(5, steps // 10)
        for mode in args.modes:
            t = run(kind, mode, args, hf)
            hf_cols = (
                f"{t['accelerate']:>15.3f}{t['accelerate'] / t['raw']:>7.3f}"
                if "accelerate" in t
                else f"{'-':>15}{'-':>7}"
            )
            print(f"{kind:<7}{mode:<6}{t['raw']:>9.3f}{t['accel']:>10.3f}"
                  f"{t['accel'] / t['raw']:>7.3f}{hf_cols}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
