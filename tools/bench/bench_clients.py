"""Benchmark transformers on accel (through `accel.use_as_accelerate()`) against accelerate.

    uv run --group bench python tools/bench/bench_clients.py [--rounds 5] [--steps 60]

Needs transformers, diffusers and the real accelerate (the `bench` group installs it). Every measurement
runs in a fresh process, accel and accelerate alternating round by round, on the same machine:

  trainer  `Trainer.train()` of a tiny Llama (hidden 32, 2 layers) on 1 CPU process: the
           median time per optimizer step after 10 warm-up steps (a callback stamps each
           step's end).
  load     `from_pretrained(dir, device_map="auto", max_memory={"cpu": ...},
           offload_folder=...)` of a ~130 MB Llama (hidden 512, 8 layers) with about half
           of it spilled to disk: the load time, then the first forward of 32 tokens.
  offload  a diffusers StableDiffusionPipeline's UNet (about 10 MB) after
           `enable_sequential_cpu_offload(device="cpu")` (accelerate's `cpu_offload`): the
           median time of a denoising step (one UNet call) over 17 steps after 3 warm-up ones.

Prints a markdown table: the median and the best round of each, and accel / accelerate for
both (on a shared machine the best round is the steadier figure).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _switch(impl: str) -> None:
    if impl == "accel":
        import accel

        accel.use_as_accelerate()


def _tiny_config(big: bool) -> Any:
    from transformers import LlamaConfig

    if big:
        return LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376,
                           num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                           tie_word_embeddings=False)  # fmt: skip
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False)  # fmt: skip


def case_trainer(impl: str, steps: int) -> dict[str, float]:
    _switch(impl)
    import torch
    import transformers
    from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4 * steps, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": x, "labels": x} for x in ids]
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, per_device_train_batch_size=4, max_steps=steps,
                                 report_to=[], save_strategy="no",
                                 logging_strategy="no", disable_tqdm=True)  # fmt: skip
        model = LlamaForCausalLM(_tiny_config(big=False))
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Stamp()])
        assert type(trainer.accelerator).__module__.split(".")[0] == impl, trainer.accelerator
        trainer.train()
    gaps = [b - a for a, b in itertools.pairwise(stamps[10:])]
    return {"step_ms": 1000 * statistics.median(gaps)}


def case_load(impl: str, folder: str, max_memory: str) -> dict[str, float]:
    _switch(impl)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as offload:
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            folder, device_map="auto", max_memory={"cpu": max_memory}, offload_folder=offload
        )
        loaded = time.perf_counter()
        assert "disk" in set(model.hf_device_map.values()), model.hf_device_map
        answered_by_accel = "+accel" in sys.modules["accelerate"].__version__
        assert answered_by_accel == (impl == "accel"), sys.modules["accelerate"].__version__
        with torch.no_grad():
            model(torch.arange(32)[None])
        forward = time.perf_counter()
    return {"load_s": loaded - start, "first_forward_s": forward - loaded}


def case_offload(impl: str, steps: int) -> dict[str, float]:
    """A diffusers UNet (about 10 MB) under `enable_sequential_cpu_offload(device="cpu")`:
    the median time of one denoising step (a UNet call), every weight streamed in per call."""
    _switch(impl)
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    answered_by_accel = "+accel" in sys.modules["accelerate"].__version__
    assert answered_by_accel == (impl == "accel"), sys.modules["accelerate"].__version__
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(64, 128), norm_num_groups=32, cross_attention_dim=64,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )  # fmt: skip
    pipe = StableDiffusionPipeline(
        unet=unet, vae=None, text_encoder=None, tokenizer=None, scheduler=None,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    latents, text = torch.randn(1, 4, 16, 16), torch.randn(1, 8, 64)

    def step_ms() -> float:
        times = []
        with torch.no_grad():
            for _ in range(steps):
                start = time.perf_counter()
                pipe.unet(latents, 10, encoder_hidden_states=text)
                times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times[3:])

    plain = step_ms()
    pipe.enable_sequential_cpu_offload(device="cpu")
    try:
        offloaded = step_ms()
    except Exception as error:  # accelerate 1.15 raises here on CPU (see the README)
        print(f"{impl}: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)
        offloaded = float("nan")
    return {"plain_step_ms": plain, "offload_step_ms": offloaded}


def _run(*args: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _row(name: str, accel: list[float], accelerate: list[float], unit: str) -> str:
    if any(math.isnan(x) for x in accelerate):
        a = statistics.median(accel)
        return f"| {name} ({unit}) | {a:.3f} / {min(accel):.3f} | fails | - |"
    a, b = statistics.median(accel), statistics.median(accelerate)
    return (
        f"| {name} ({unit}) | {a:.3f} / {min(accel):.3f} | {b:.3f} / {min(accelerate):.3f} "
        f"| {a / b:.2f}x / {min(accel) / min(accelerate):.2f}x |"
    )


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--max-memory", default="64MB", help="CPU budget of the disk-spill load")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case == "trainer":
        print(json.dumps(case_trainer(args.impl, args.steps)))
        return
    if args.case == "offload":
        print(json.dumps(case_offload(args.impl, 20)))
        return
    if args.case == "load":
        print(json.dumps(case_load(args.impl, args.folder, args.max_memory)))
        return
    import importlib.metadata

    print(f"accelerate {importlib.metadata.version('accelerate')}, "
          f"transformers {importlib.metadata.version('transformers')}")  # fmt: skip
    results: dict[str, dict[str, list[float]]] = {"accel": {}, "accelerate": {}}
    with tempfile.TemporaryDirectory() as folder:
        from transformers import LlamaForCausalLM

        LlamaForCausalLM(_tiny_config(big=True)).save_pretrained(folder)
        size = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors")) / 2**20
        print(f"load case: {size:.0f} MiB checkpoint, max_memory cpu {args.max_memory}")
        for _ in range(args.rounds):
            for impl in ("accel", "accelerate"):
                for case in (
                    _run("--case", "trainer", "--impl", impl, "--steps", str(args.steps)),
                    _run("--case", "load", "--impl", impl, "--folder", folder,
                         "--max-memory", args.max_memory),
                    _run("--case", "offload", "--impl", impl),
                ):  # fmt: skip
                    for key, value in case.items():
                        results[impl].setdefault(key, []).append(value)
    print("\n| case | accel median / best | accelerate median / best | accel / accelerate |")
    print("|---|---|---|---|")
    for key, name, unit in (
        ("step_ms", "Trainer step, tiny Llama, 1 process", "ms"),
        ("load_s", 'from_pretrained(device_map="auto"), disk spill', "s"),
        ("first_forward_s", "first forward after that load", "s"),
        ("plain_step_ms", "diffusers UNet step, no offload", "ms"),
        ("offload_step_ms", "diffusers UNet step, enable_sequential_cpu_offload", "ms"),
    ):
        print(_row(name, results["accel"][key], results["accelerate"][key], unit))


if __name__ == "__main__":
    main()
