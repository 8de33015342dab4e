"""FSDP2 through accel against the same loop written with raw `fully_shard`, on 2 processes.

    uv run --frozen python tools/bench/bench_fsdp.py [--steps 20] [--rounds 5] [--save-mb 600]

Spawns 2 CPU processes (gloo, OMP_NUM_THREADS=1). Per rank:

- step time, tiny (3 blocks of width 64, batch 16) and medium (4 blocks of width 1024, batch 64)
  models: raw (`fully_shard` on each block and the root, AdamW, `loss.backward(); opt.step();
  opt.zero_grad()`) against accel (`Accelerator(fsdp_plugin=...)`, the same loop through
  `prepare`); rounds alternate the order; median ms per step and the ratio;
- memory per rank of parameters + AdamW state after one step: FSDP2 against DDP;
- sharded checkpoint of a `--save-mb` model + AdamW: raw `dcp.save` of the model and optimizer
  state dicts against `accelerator.save_state` (both fsync their files; accel also writes its
  per-process state and completion marker, and renames the folder into place), and how long
  `save_state(async_save=True)` holds the loop (staging in CPU memory) against the whole
  asynchronous save. Median of 3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


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


SHAPES = {"tiny": (64, 3, 16), "medium": (1024, 4, 64)}  # width, blocks, batch per rank


def make(kind: str) -> Net:
    width, blocks, _ = SHAPES[kind]
    torch.manual_seed(0)
    return Net(width, blocks)


def raw_setup(kind: str):
    from torch.distributed.fsdp import fully_shard

    model = make(kind)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step


def accel_setup(kind: str, **plugin):
    from accel import Accelerator, AcceleratorState, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(**plugin))
    model = make(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()

    return model, opt, step, acc


def ddp_setup(kind: str):
    model = nn.parallel.DistributedDataParallel(make(kind))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step


def local_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    def size(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(size(p) for p in model.parameters())
    states = sum(size(v) for s in opt.state.values() for v in s.values() if v.ndim > 0)
    return params + states


def timed(step, batches, steps: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    dist.barrier()
    return (time.perf_counter() - start) / steps * 1e3


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result: dict = {}
    for kind in ("tiny", "medium"):
        width, _, batch = SHAPES[kind]
        g = torch.Generator().manual_seed(rank)
        batches = [(torch.randn(batch, width, generator=g), torch.randn(batch, 1, generator=g))
                   for _ in range(4)]  # fmt: skip
        _, _, raw_step = raw_setup(kind)
        _, _, acc_step, _ = accel_setup(kind, transformer_cls_names_to_wrap=["Block"])
        for step in (raw_step, acc_step):
            timed(step, batches, 3)
        steps = args.steps if kind == "tiny" else max(3, args.steps // 4)
        times: dict[str, list[float]] = {"raw": [], "accel": []}
        for r in range(args.rounds):
            order = [("raw", raw_step), ("accel", acc_step)]
            for name, step in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(step, batches, steps))
        result[kind] = {k: statistics.median(v) for k, v in times.items()}
    # memory per rank: parameters + AdamW state after one step, FSDP2 against DDP
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 1024, generator=g), torch.randn(64, 1, generator=g)
    model, opt, step, _ = accel_setup("medium", transformer_cls_names_to_wrap=["Block"])
    step(x, y)
    fsdp_bytes = local_bytes(model, opt)
    model, opt, step = ddp_setup("medium")
    step(x, y)
    result["memory"] = {"fsdp": fsdp_bytes, "ddp": local_bytes(model, opt)}
    if args.save_mb:
        result["save"] = save_bench(args, rank)
    if rank == 0:
        out.update(result)
    dist.destroy_process_group()


def save_bench(args: argparse.Namespace, rank: int) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    width = 2048
    blocks = max(1, round(args.save_mb * 2**20 / (2 * (width * width + width) * 4)))
    shapes = SHAPES["big"] = (width, blocks, 8)
    x, y = torch.randn(shapes[2], width), torch.randn(shapes[2], 1)
    root = tempfile.mkdtemp(prefix="bench_fsdp_save_") if rank == 0 else None
    holder = [root]
    dist.broadcast_object_list(holder)
    root = holder[0]
    times: dict[str, list[float]] = {
        "raw dcp.save": [], "accel save_state": [], "async blocks": [], "async total": []
    }  # fmt: skip
    model, opt, step = raw_setup("big")
    step(x, y)
    _, _, acc_step, acc = accel_setup("big", transformer_cls_names_to_wrap=["Block"])
    acc_step(x, y)
    for r in range(3):
        folder = f"{root}/raw_{r}"
        dist.barrier()
        start = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=folder)
        dist.barrier()
        times["raw dcp.save"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        acc.save_state(f"{root}/accel_{r}")
        dist.barrier()
        times["accel save_state"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        acc.save_state(f"{root}/async_{r}", async_save=True)
        times["async blocks"].append(time.perf_counter() - start)  # the loop goes on from here
        acc.wait_for_checkpoint()
        times["async total"].append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    params = sum(p.numel() for p in model.parameters()) * 4
    return {"model_mb": params / 2**20, **{k: statistics.median(v) for k, v in times.items()}}


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--save-mb", type=float, default=600, help="0: skip the checkpoint case")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(2, port, args, out), nprocs=2, join=True)
    r = dict(out)
    print(f"torch {torch.__version__}, 2 processes on CPU (gloo)")
    print(f"{'model':<8}{'raw ms':>10}{'accel ms':>10}{'accel/raw':>11}")
    for kind in ("tiny", "medium"):
        t = r[kind]
        print(f"{kind:<8}{t['raw']:>10.3f}{t['accel']:>10.3f}{t['accel'] / t['raw']:>11.3f}")
    m = r["memory"]
    print(f"memory per rank (medium, parameters + AdamW state): FSDP2 {m['fsdp'] / 2**20:.1f} MiB,"
          f" DDP {m['ddp'] / 2**20:.1f} MiB, ratio {m['fsdp'] / m['ddp']:.3f}")  # fmt: skip
    if "save" in r:
        s = r["save"]
        raw, ours = s["raw dcp.save"], s["accel save_state"]
        print(f"sharded save of a {s['model_mb']:.0f} MiB model + AdamW: raw dcp.save {raw:.2f} s, "
              f"accel save_state {ours:.2f} s, ratio {ours / raw:.3f}")  # fmt: skip
        blocks, total = s["async blocks"], s["async total"]
        print(f"async save_state: the loop waits {blocks:.2f} s ({blocks / ours:.1%} of the "
              f"synchronous save), written and marked complete after {total:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
