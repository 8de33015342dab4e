"""DeepSpeed ZeRO-2 through accel against the same loop on a raw `deepspeed.initialize` engine,
and HuggingFace accelerate's DeepSpeed path in the same run when it can run here.

    uv run --frozen python tools/bench/bench_deepspeed.py [--steps 40] [--rounds 5]
    uv run --group bench python tools/bench/bench_deepspeed.py      # with accelerate

Spawns 2 CPU processes (gloo, OMP_NUM_THREADS=1; DeepSpeed picks its CPU accelerator). Per
rank, for a tiny (3 blocks of width 64, batch 16) and a medium (4 blocks of width 1024, batch
64) model, each with AdamW, ZeRO stage 2, fp32:

- raw: `engine, *_ = deepspeed.initialize(model=..., optimizer=..., config=...)`, then
  `engine.backward(loss); engine.step()`;
- accel: `Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))`, `prepare(model, opt,
  loader)`, then `accelerator.backward(loss); opt.step(); opt.zero_grad()`;
- accelerate: the same loop with accelerate's Accelerator and DeepSpeedPlugin (created
  without `cpu=True`: with it, accelerate ignores the plugin and trains with DDP).

Many short rounds alternate the order (the machine may be shared); the figure is the median
ms per step over rounds (each round the mean of `--steps` steps, `--steps // 4` for medium),
with the ratio to raw. The "interleaved" rows time the same steps one at a time, alternating
the loops step by step, and give the median step.

accelerate 1.15 cannot run its DeepSpeed path on 2 CPU processes: with `cpu=True` it ignores
the plugin and trains with DDP; without it, it picks no process-group backend on a CPU, counts
1 process, and DeepSpeed's batch-size check fails. The script says so instead of timing it.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

SHAPES = {"tiny": (64, 3, 16), "medium": (1024, 4, 64)}  # width, blocks, batch per rank


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make(kind: str) -> tuple[Net, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    width, blocks, batch = SHAPES[kind]
    torch.manual_seed(0)
    model = Net(width, blocks)
    data = torch.utils.data.TensorDataset(torch.randn(batch * 4, width), torch.randn(batch * 4, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=batch)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), loader


def raw_setup(kind: str):
    import deepspeed

    model, opt, _ = make(kind)
    config = {
        "train_micro_batch_size_per_gpu": SHAPES[kind][2],
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        engine.backward(nn.functional.mse_loss(engine(x), y))
        engine.step()

    return step


def accel_setup(kind: str):
    from accel import Accelerator, AcceleratorState, DeepSpeedPlugin

    AcceleratorState._reset_state(reset_partial_state=False)
    acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model, opt, loader = acc.prepare(*make(kind))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()

    return step


def accelerate_setup(kind: str):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin

    AcceleratorState._reset_state()  # accelerate refuses a second plugin otherwise
    # not cpu=True: with it accelerate ignores the plugin and runs DDP (MULTI_CPU)
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    if acc.num_processes != dist.get_world_size():
        raise RuntimeError(
            f"accelerate counts {acc.num_processes} of {dist.get_world_size()} processes: it "
            f"picks no process-group backend for DeepSpeed on a CPU (and with cpu=True it "
            f"trains with DDP instead of DeepSpeed)"
        )
    model, opt, loader = acc.prepare(*make(kind))
    if type(model).__name__ != "DeepSpeedEngine":
        raise RuntimeError(f"accelerate prepared a {type(model).__name__}, not a DeepSpeed engine")

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()

    return step


def timed(step, batches, steps: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    dist.barrier()
    return (time.perf_counter() - start) / steps * 1e3


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                      LOCAL_WORLD_SIZE=str(world))  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result: dict = {"skipped": {}}
    for kind in ("tiny", "medium"):
        width, _, batch = SHAPES[kind]
        g = torch.Generator().manual_seed(rank)
        batches = [(torch.randn(batch, width, generator=g), torch.randn(batch, 1, generator=g))
                   for _ in range(4)]  # fmt: skip
        steps = {"raw": raw_setup(kind), "accel": accel_setup(kind)}
        if not args.no_accelerate:
            try:
                steps["accelerate"] = accelerate_setup(kind)
                timed(steps["accelerate"], batches, 1)
            except Exception as err:  # reported, not hidden: accelerate cannot run here
                steps.pop("accelerate", None)
                result["skipped"][f"accelerate ({kind})"] = "".join(
                    traceback.format_exception_only(type(err), err)
                ).strip()[:400]
        for step in steps.values():
            timed(step, batches, 3)
        count = args.steps if kind == "tiny" else max(3, args.steps // 4)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for r in range(args.rounds):
            order = list(steps.items())
            for name, step in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(step, batches, count))
        result[kind] = {k: statistics.median(v) for k, v in times.items()}
        # the same steps interleaved one by one: load from other programs hits both alike
        each: dict[str, list[float]] = {name: [] for name in steps}
        for i in range(args.rounds * count):
            order = list(steps.items())
            for name, step in order if i % 2 == 0 else order[::-1]:
                each[name].append(timed(step, batches[i % 4 :], 1))
        result[kind + " interleaved"] = {k: statistics.median(v) for k, v in each.items()}
    if rank == 0:
        out.update(result)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-accelerate", action="store_true", help="skip accelerate's run")
    args = parser.parse_args()
    if not args.no_accelerate:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            print("accelerate is not installed (uv run --group bench ...): raw and accel only")
            args.no_accelerate = True
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(2, free_port(), args, out), nprocs=2, join=True)
        result = dict(out)
    print(f"DeepSpeed ZeRO-2, 2 CPU processes (gloo), torch {torch.__version__}, {sys.platform}")
    for kind in ("tiny", "tiny interleaved", "medium", "medium interleaved"):
        row = result[kind]
        raw = row["raw"]
        parts = [f"raw {raw:8.2f} ms"]
        for name in ("accel", "accelerate"):
            if name in row:
                parts.append(f"{name} {row[name]:8.2f} ms ({row[name] / raw:.3f}x raw)")
        print(f"{kind:>18}: " + " | ".join(parts))
    for name, why in result["skipped"].items():
        print(f"{name} did not run here: {why}")


if __name__ == "__main__":
    main()
