"""A 2-D mesh (FSDP2 x tensor parallel) through accel against the same loop written by hand.

    uv run --frozen python tools/bench/bench_mesh.py [--steps 12] [--rounds 5]

Spawns 4 CPU processes (gloo, OMP_NUM_THREADS=1) on a ``dp_shard=2 x tp=2`` mesh. Per rank,
for a tiny (2 blocks of width 64, batch 16 per data-parallel rank) and a medium (4 blocks of
width 512, batch 32) MLP stack:

- raw: `init_device_mesh` with the dimensions ("dp_shard", "tp"), `parallelize_module` of each
  block's two Linear layers (ColwiseParallel, RowwiseParallel) on ``mesh["tp"]``,
  `fully_shard` of each block and the root on ``mesh["dp_shard"]``, AdamW,
  ``loss.backward(); opt.step(); opt.zero_grad()``;
- accel: `Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))`,
  the model declaring the same plan as ``_tp_plan``, the same loop through `prepare` and
  `accelerator.backward`.

The two loops alternate step by step (raw, accel, raw, ...; the order flips each round), so
that load from other processes on the machine falls on both alike; the median ms of each one's
steps and the ratio accel / raw are printed (rank 0's clock; every step ends in collectives,
so the ranks move together).

HuggingFace accelerate is not timed: its tensor parallel applies only to transformers models
loaded with a ``tp_plan``, so it has no way to run this plain model on the same mesh.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    _no_split_modules = ["Block"]
    _tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.mean(dim=-1, keepdim=True)


SHAPES = {"tiny": (64, 2, 16), "medium": (512, 4, 32)}  # width, blocks, batch per dp rank


def make(kind: str) -> Net:
    width, blocks, _ = SHAPES[kind]
    torch.manual_seed(0)
    return Net(width, blocks)


def raw_setup(kind: str, mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = make(kind)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return step


def accel_setup(kind: str):
    from accel import (
        Accelerator,
        AcceleratorState,
        FullyShardedDataParallelPlugin,
        ParallelismConfig,
    )

    AcceleratorState._reset_state()
    acc = Accelerator(
        cpu=True,
        parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
        fsdp_plugin=FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"]),
    )
    model = make(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)

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


def one(step, batch) -> float:
    """One step from a common start (a barrier first), in ms."""
    dist.barrier()
    start = time.perf_counter()
    step(*batch)
    return (time.perf_counter() - start) * 1e3


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    result: dict = {}
    for kind in ("tiny", "medium"):
        width, _, batch = SHAPES[kind]
        g = torch.Generator().manual_seed(rank // 2)  # one batch stream per data-parallel rank
        batches = [(torch.randn(batch, width, generator=g), torch.randn(batch, 1, generator=g))
                   for _ in range(4)]  # fmt: skip
        raw_step, acc_step = raw_setup(kind, mesh), accel_setup(kind)
        for step in (raw_step, acc_step):
            timed(step, batches, 3)
        steps = args.steps if kind == "tiny" else max(3, args.steps // 3)
        times: dict[str, list[float]] = {"raw": [], "accel": []}
        for r in range(args.rounds):
            order = [("raw", raw_step), ("accel", acc_step)]
            dist.barrier()
            for i in range(steps):
                for name, step in order if r % 2 == 0 else order[::-1]:
                    times[name].append(one(step, batches[i % len(batches)]))
        result[kind] = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        out.update(result)
    dist.destroy_process_group()


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(4, port, args, out), nprocs=4, join=True)
    r = dict(out)
    print(f"torch {torch.__version__}, 4 processes on CPU (gloo), mesh dp_shard=2 x tp=2")
    print(f"{'model':<8}{'raw ms':>10}{'accel ms':>10}{'accel/raw':>11}")
    for kind in ("tiny", "medium"):
        t = r[kind]
        print(f"{kind:<8}{t['raw']:>10.3f}{t['accel']:>10.3f}{t['accel'] / t['raw']:>11.3f}")


if __name__ == "__main__":
    main()
