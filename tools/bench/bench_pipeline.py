"""Pipeline parallel (pp=2) through accel against torch's own schedule on the same split.

    uv run --frozen python tools/bench/bench_pipeline.py [--steps 8] [--rounds 3]

Spawns 2 CPU processes (gloo, OMP_NUM_THREADS=1). The model is a stack of 8 MLP blocks of
width 256 and a head; the batch of 64 is split into 8 micro-batches. For each schedule
(GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble):

- raw: the blocks cut by hand into the same stages accel makes (2 per rank for the
  interleaved and V schedules), `PipelineStage` and the schedule class from
  `torch.distributed.pipelining`, ``schedule.step(x, target=y)``, AdamW step, zero_grad;
- accel: `Accelerator(parallelism_config=ParallelismConfig(pp_size=2, pp_schedule=...,
  pp_microbatches=8, pp_plan=[...], pp_loss_fn=mse))`, and the familiar loop
  ``out = model(x, labels=y); accelerator.backward(out.loss); opt.step(); opt.zero_grad()``.

The two alternate step by step (the order flips each round) and the medians are printed with
their ratio (a step's time is the slower rank's). The bubble fraction is measured as
1 - (the rank's pure compute for one step) / (the step's time), where the compute is the forward and backward of this rank's stages on
every micro-batch run alone, with no communication; the theoretical fraction is
(p - 1) / (v * m + p - 1) for p ranks, v stages per rank and m micro-batches (zero-bubble
schedules: ideally 0 when the weight-gradient work fills the gaps). Every process shares two
CPU cores with the others, so "communication" here includes waiting for the other rank.
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

WIDTH, BLOCKS, BATCH, MICRO = 256, 8, 64, 8
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make() -> Net:
    torch.manual_seed(0)
    return Net()


def _stages(schedule: str) -> tuple[int, dict[int, int]]:
    from accel_parallel._pipeline_plan import PP_SCHEDULES, stage_to_rank

    virtual = PP_SCHEDULES[schedule][2]
    return 2 * virtual, stage_to_rank(schedule, 2, 2 * virtual)


def raw_setup(schedule: str, rank: int):
    """torch.distributed.pipelining by hand, on the split accel makes."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    from accel_parallel._pipeline_plan import PP_SCHEDULES, build_stages

    model = make()
    num, placement = _stages(schedule)
    modules = build_stages(model, ["blocks", "head"], num)
    mine = [(i, m) for i, m in enumerate(modules) if placement[i] == rank]
    stages = [PipelineStage(m, i, num, torch.device("cpu")) for i, m in mine]
    cls = get_schedule_class(schedule)
    target = stages if PP_SCHEDULES[schedule][0] else stages[0]
    sched = cls(target, n_microbatches=MICRO, loss_fn=nn.functional.mse_loss)
    params = [p for _, m in mine for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    first = any(i == 0 for i, _ in mine)
    last = any(i == num - 1 for i, _ in mine)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        sched.step(*((x,) if first else ()), target=y if last else None, losses=[])
        opt.step()
        opt.zero_grad()

    return step, [m for _, m in mine]


def accel_setup(schedule: str):
    from accel import Accelerator, AcceleratorState, ParallelismConfig

    AcceleratorState._reset_state()
    config = ParallelismConfig(
        pp_size=2, pp_schedule=schedule, pp_microbatches=MICRO, pp_plan=["blocks", "head"],
        pp_loss_fn=nn.functional.mse_loss,
    )  # fmt: skip
    acc = Accelerator(cpu=True, parallelism_config=config)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(model(x, labels=y).loss)
        opt.step()
        opt.zero_grad()

    return step


def compute_ms(modules: list[nn.Module], batch: torch.Tensor) -> float:
    """This rank's stages, forward and backward on every micro-batch, without communication."""
    micro = batch.chunk(MICRO)[0]
    inputs = [torch.randn(micro.shape[0], WIDTH, requires_grad=True) for _ in modules]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(MICRO):
            for module, x in zip(modules, inputs):
                module(x).sum().backward()
        times.append((time.perf_counter() - start) * 1e3)
    for module in modules:
        module.zero_grad()
    return statistics.median(times)


def one(step, batch) -> float:
    """One step from a common start, in ms, until the slower rank is done (a pipeline step
    ends when its last stage does, whichever rank measures it)."""
    dist.barrier()
    start = time.perf_counter()
    step(*batch)
    elapsed = torch.tensor([(time.perf_counter() - start) * 1e3])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g))
               for _ in range(4)]  # fmt: skip
    result: dict = {}
    for schedule in SCHEDULES:
        raw_step, modules = raw_setup(schedule, rank)
        acc_step = accel_setup(schedule)
        for step in (raw_step, acc_step):
            for i in range(2):
                one(step, batches[i])
        times: dict[str, list[float]] = {"raw": [], "accel": []}
        for r in range(args.rounds):
            order = [("raw", raw_step), ("accel", acc_step)]
            for i in range(args.steps):
                for name, step in order if r % 2 == 0 else order[::-1]:
                    times[name].append(one(step, batches[i % len(batches)]))
        medians = {k: statistics.median(v) for k, v in times.items()}
        compute = compute_ms(modules, batches[0][0])
        medians["bubble"] = max(0.0, 1 - compute / medians["accel"])
        medians["compute"] = compute
        result[schedule] = medians
    gathered: list = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        out.update({"ranks": gathered})
    dist.destroy_process_group()


def theoretical(schedule: str) -> float:
    from accel_parallel._pipeline_plan import PP_SCHEDULES

    if "ZeroBubble" in schedule:
        return 0.0
    p, v = 2, PP_SCHEDULES[schedule][2]
    return (p - 1) / (v * MICRO + p - 1)


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(2, port, args, out), nprocs=2, join=True)
    ranks = out["ranks"]
    print(
        f"torch {torch.__version__}, 2 processes on CPU (gloo), pp=2, {BLOCKS} blocks of width "
        f"{WIDTH}, batch {BATCH} in {MICRO} micro-batches"
    )
    print(
        f"{'schedule':<17}{'raw ms':>9}{'accel ms':>10}{'accel/raw':>11}"
        f"{'bubble r0':>11}{'bubble r1':>11}{'theory':>8}"
    )
    for schedule in SCHEDULES:
        t = ranks[0][schedule]
        bubbles = [r[schedule]["bubble"] for r in ranks]
        print(
            f"{schedule:<17}{t['raw']:>9.2f}{t['accel']:>10.2f}{t['accel'] / t['raw']:>11.3f}"
            f"{bubbles[0]:>11.3f}{bubbles[1]:>11.3f}{theoretical(schedule):>8.3f}"
        )


if __name__ == "__main__":
    main()
