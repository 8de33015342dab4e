"""32 ranks for real, launched by test_scale_real.py: one launch trains, saves mid-epoch, trains
on, then resumes from that checkpoint in the same processes and trains to the same step; rank
0 writes both runs' results and the wall time of each phase.

    python _scale_train.py ddp|fsdp2 OUT_DIR [--hang READY_FILE]

One sample per process a step (a global batch of the world size), shuffled by a seeded
generator, so that with 32 processes an epoch is 2 steps and the save at step SAVE_AT is
mid-epoch: the resumed run equals the uninterrupted one only when the weights, the optimizer,
the RNG and the data position all come back. The resumed run starts from a fresh network (the
initial weights), a fresh optimizer and a fresh loader, after `free_memory()` dropped the
first run's objects. With --hang the ranks then meet in accel's numbered collectives until
the test takes one machine away (rank 0 writes READY_FILE once they do), for the hang doctor
of `accel launch --hang_timeout` to name it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

# _store_train's network, data and step count (this script's folder is the first entry of
# its import path)
from _store_train import ADAM_EPS, CLIP, LR, STEPS, Progress, dataset, make_net
from torch import nn

SAVE_AT = 3


def _accelerator(engine: str) -> Any:
    from accel import Accelerator
    from accel.utils import FullyShardedDataParallelPlugin

    if engine == "fsdp2":
        return Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    return Accelerator(cpu=True)


def _run(acc: Any, progress: Progress, out: Path, resume: Path | None) -> dict[str, Any]:
    """Train to STEPS (saving after SAVE_AT, or first resuming from `resume`)."""
    times: dict[str, float] = {}
    started = time.perf_counter()
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, eps=ADAM_EPS)
    loader = torch.utils.data.DataLoader(
        dataset(), batch_size=1, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    model, opt, loader = acc.prepare(net, opt, loader)
    times["prepare"] = time.perf_counter() - started
    progress.step = 0
    if resume is not None:
        started = time.perf_counter()
        acc.load_state(resume)
        times["load_state"] = time.perf_counter() - started
    batches: dict[int, list[int]] = {}
    steps, step_time = 0, 0.0
    while progress.step < STEPS:
        for x, y, index in loader:
            started = time.perf_counter()
            acc.backward(nn.functional.mse_loss(model(x), y))
            acc.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()
            step_time += time.perf_counter() - started
            steps += 1
            progress.step += 1
            batches[progress.step] = sorted(acc.gather(index).tolist())
            if progress.step == SAVE_AT and resume is None:
                started = time.perf_counter()
                acc.save_state(out / f"step{SAVE_AT}")
                times["save_state"] = time.perf_counter() - started
            if progress.step == STEPS:
                break
    times["step"] = step_time / max(steps, 1)
    state = {k: v.detach().float().cpu().clone() for k, v in acc.get_state_dict(model).items()}
    acc.free_memory()
    return {"state": state, "batches": batches, "times": times}


def _slowest(acc: Any, times: dict[str, float]) -> dict[str, float]:
    """Each phase's longest time over the ranks."""
    names = sorted(times)
    every = acc.gather(torch.tensor([times[n] for n in names], dtype=torch.float64)[None])
    return dict(zip(names, every.max(dim=0).values.tolist()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=["ddp", "fsdp2"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hang", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    acc = _accelerator(args.engine)
    init = time.perf_counter() - started
    progress = Progress()
    acc.register_for_checkpointing(progress)
    full = _run(acc, progress, args.out, resume=None)
    resumed = _run(acc, progress, args.out, resume=args.out / f"step{SAVE_AT}")
    times = {"init": init}
    times.update({f"full.{k}": v for k, v in full["times"].items()})
    times.update({f"resumed.{k}": v for k, v in resumed["times"].items()})
    slowest = _slowest(acc, times)
    if acc.is_main_process:
        checkpoint = args.out / f"step{SAVE_AT}"
        files = [p for p in checkpoint.rglob("*") if p.is_file()]
        torch.save(
            {
                "world": acc.num_processes,
                "full": {k: full[k] for k in ("state", "batches")},
                "resumed": {k: resumed[k] for k in ("state", "batches")},
                "times_rank0": times,
                "times_slowest": slowest,
                "files": len(files),
                "metadata_bytes": sum(p.stat().st_size for p in files if p.name == ".metadata"),
            },
            args.out / f"result-{args.engine}.pt",
        )
    if args.hang is None:
        acc.end_training()
        return
    for step in range(100_000):
        acc.reduce(torch.ones(4), reduction="sum")  # a numbered collective, once per step
        if step == 5 and acc.is_main_process:
            args.hang.write_text("ready")
        time.sleep(0.02)
    sys.exit("the hang was never noticed")


if __name__ == "__main__":
    main()
