"""Step time of a stack of wide linear layers: bf16 against fp8 (torchao, TransformerEngine).

    uv run --frozen --group bench python tools/bench/bench_fp8.py [--width 4096] [--layers 8]
        [--tokens 8192 16384] [--steps 30] [--eager] [--agree-steps 50]

One step is forward, backward and an SGD update over `--layers` Linear(width, width) layers
with GELU between them, on `--tokens` tokens. Variants, each timed in the same run:
raw PyTorch bf16 autocast (the baseline), accel bf16, torchao's own fp8 conversion without
accel, accel fp8 with torchao (its tensorwise and its rowwise recipe), accel fp8 with
TransformerEngine (when installed), and HuggingFace accelerate's fp8 with torchao (when
installed). Every layer of the stack is converted (the first/last-layer rule is off here:
the stack is the thing measured). torch.compile is on unless `--eager` (torchao's float8
relies on it to fuse its casts). Prints median step times and ratios against raw bf16, for
each token count. Then loss agreement: the same stack, init and data trained `--agree-steps`
AdamW steps towards a fixed random target under accel bf16 and accel fp8 (each backend),
printing the losses side by side and the largest relative difference from bf16.
Needs a CUDA GPU of compute capability >= 8.9 for fp8; exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import traceback
from collections.abc import Callable

import torch
from torch import nn


def _stack(width: int, layers: int) -> nn.Module:
    mods: list[nn.Module] = []
    for i in range(layers):
        mods.append(nn.Linear(width, width, bias=False))
        if i < layers - 1:
            mods.append(nn.GELU())
    return nn.Sequential(*mods).cuda()


def _time(step: Callable[[], None], steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _loop(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, ctx, backward, step):
    def run() -> None:
        with ctx():
            loss = model(x).float().pow(2).mean()
        backward(loss)
        step(opt)
        opt.zero_grad(set_to_none=True)

    return run


def raw_bf16(args: argparse.Namespace, x: torch.Tensor) -> Callable[[], None]:
    model = _stack(args.width, args.layers)
    model = model if args.eager else torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ctx = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    return _loop(model, opt, x, ctx, lambda loss: loss.backward(), lambda o: o.step())


def raw_torchao_fp8(args: argparse.Namespace, x: torch.Tensor) -> Callable[[], None]:
    """torchao's own float8 training conversion with bf16 autocast, no accel."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = convert_to_float8_training(_stack(args.width, args.layers), config=Float8LinearConfig())
    model = model if args.eager else torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ctx = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    return _loop(model, opt, x, ctx, lambda loss: loss.backward(), lambda o: o.step())


def accel_variant(mode: str, fp8_kwargs=None) -> Callable:
    def build(args: argparse.Namespace, x: torch.Tensor) -> Callable[[], None]:
        from accel_precision import make_precision

        p = make_precision(mode, device_type="cuda", fp8_kwargs=fp8_kwargs)
        model = p.convert_module(_stack(args.width, args.layers))
        model = model if args.eager else torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def step(o: torch.optim.Optimizer) -> None:
            p.step(o)
            p.update()

        return _loop(model, opt, x, p.autocast, p.backward, step)

    return build


def hf_accelerate_fp8_ao(args: argparse.Namespace, x: torch.Tensor) -> Callable[[], None]:
    from accelerate import Accelerator
    from accelerate.utils import AORecipeKwargs

    # accelerate skips the first and last linear layers itself: pad the stack so that the
    # measured layers are all converted, as in the accel variants.
    model = nn.Sequential(
        nn.Linear(args.width, args.width, bias=False),
        *_stack(args.width, args.layers),
        nn.Linear(args.width, args.width, bias=False),
    )
    acc = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    model = model if args.eager else torch.compile(model)

    def step(o: torch.optim.Optimizer) -> None:
        o.step()

    return _loop(model, opt, x, acc.autocast, acc.backward, step)


def agreement(args: argparse.Namespace, kinds: dict) -> None:
    """Train the same stack on the same data in bf16 and in fp8; compare the loss curves."""
    from accel_precision import make_precision

    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(args.tokens[0], args.width, device="cuda", generator=g)
    y = torch.randn(args.tokens[0], args.width, device="cuda", generator=g)
    curves: dict[str, list[float]] = {}
    for name, (mode, kw) in kinds.items():
        try:
            p = make_precision(mode, device_type="cuda", fp8_kwargs=kw)
            torch.manual_seed(0)
            model = p.convert_module(_stack(args.width, args.layers))
            model = model if args.eager else torch.compile(model)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            losses = []
            for _ in range(args.agree_steps):
                with p.autocast():
                    loss = nn.functional.mse_loss(model(x).float(), y)
                p.backward(loss)
                p.step(opt)
                p.update()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
            curves[name] = losses
        except Exception as err:
            print(f"  {name}: skipped: {type(err).__name__}: {str(err).splitlines()[0][:150]}")
        torch.cuda.empty_cache()
    base = curves.get("bf16")
    if not base:
        return
    print(f"loss agreement over {args.agree_steps} steps ({args.tokens[0]} tokens, AdamW 1e-4):")
    marks = sorted({0, 9, args.agree_steps // 2 - 1, args.agree_steps - 1})
    print("  step " + "".join(f"{name:>14}" for name in curves))
    for i in marks:
        print(f"  {i + 1:>4} " + "".join(f"{c[i]:>14.6f}" for c in curves.values()))
    for name, c in curves.items():
        if name != "bf16":
            worst = max(abs(a - b) / abs(b) for a, b in zip(c, base))
            print(f"  {name}: largest relative loss difference from bf16 {worst:.4f}; "
                  f"final loss {c[-1] / base[-1]:.4f}x of bf16's")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--eager", action="store_true", help="no torch.compile")
    parser.add_argument("--agree-steps", type=int, default=50, help="0: no loss comparison")
    parser.add_argument("--verbose", action="store_true", help="tracebacks of skipped variants")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            "bench_fp8: no CUDA GPU is visible; fp8 needs one of compute capability >= 8.9. Skipped."
        )
        return 0
    cap = torch.cuda.get_device_capability()
    print(
        f"device: {torch.cuda.get_device_name()} (capability {cap[0]}.{cap[1]}), torch {torch.__version__}"
    )
    from accel_precision import AORecipeKwargs, TERecipeKwargs

    ao = AORecipeKwargs(skip_first_last=False, min_features=0)
    ao_rowwise = AORecipeKwargs(recipe="rowwise", skip_first_last=False, min_features=0)
    variants = {
        "raw torch bf16": raw_bf16,
        "accel bf16": accel_variant("bf16"),
        "raw torchao fp8": raw_torchao_fp8,
        "accel fp8 (ao)": accel_variant("fp8", ao),
        "accel fp8 (ao rowwise)": accel_variant("fp8", ao_rowwise),
        "accel fp8 (te)": accel_variant("fp8", TERecipeKwargs()),
        "accelerate fp8 (ao)": hf_accelerate_fp8_ao,
    }
    skipped: set[str] = set()
    for tokens in args.tokens:
        print(
            f"stack: {args.layers} x Linear({args.width}, {args.width}), {tokens} tokens, "
            f"{'eager' if args.eager else 'torch.compile'}"
        )
        x = torch.randn(tokens, args.width, device="cuda")
        results: dict[str, float] = {}
        for name, build in variants.items():
            if name in skipped:
                continue
            try:
                results[name] = _time(build(args, x), args.steps, args.warmup)
            except Exception as err:  # a missing backend or an unsupported GPU skips it
                skipped.add(name)
                print(
                    f"  {name:22s} skipped: {type(err).__name__}: {str(err).splitlines()[0][:150]}"
                )
                if args.verbose:
                    traceback.print_exc()
                continue
            torch.cuda.empty_cache()
        base = results.get("raw torch bf16")
        for name, ms in results.items():
            ratio = f"  speedup vs raw bf16 {base / ms:5.2f}x" if base else ""
            print(f"  {name:22s} {ms:8.2f} ms/step{ratio}")
        if "accel fp8 (ao)" in results and "accelerate fp8 (ao)" in results:
            print(
                f"  accel/accelerate fp8 (ao) time ratio: "
                f"{results['accel fp8 (ao)'] / results['accelerate fp8 (ao)']:.3f}"
            )
        del x
        torch.cuda.empty_cache()
    if args.agree_steps:
        kinds = {"bf16": ("bf16", None), "fp8 (ao)": ("fp8", ao)}
        if "accel fp8 (ao rowwise)" not in skipped:
            kinds["fp8 (ao rowwise)"] = ("fp8", ao_rowwise)
        if "accel fp8 (te)" not in skipped:
            kinds["fp8 (te)"] = ("fp8", TERecipeKwargs())
        agreement(args, kinds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
