"""What test_slurm.py runs on the SLURM cluster.

    python _slurm_worker.py topology OUT TAG   the topology accel-state reads, and a sum over
                                               the process group: OUT/TAG_<rank>.json
    python _slurm_worker.py ddp OUT            SGD on a fixed global batch of 8 (split between
                                               the processes); OUT/weights.pt from rank 0
    python _slurm_worker.py train PROJECT [--wait_at STEP]
                                               _resumable_train's model and data, resumed from
                                               the newest checkpoint; on a fresh start with
                                               --wait_at, waits at STEP for a stop request,
                                               saves and returns; else trains to the end and
                                               saves PROJECT/final

Each job script records what it needs beside these files; the test reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed
from accel_state import PartialState

GLOBAL_BATCH = 8
DDP_STEPS = 6
DDP_LR = 0.1


def topology(out: Path, tag: str) -> None:
    state = PartialState(cpu=True)
    total = float(state.process_index + 1)
    if state.use_distributed:
        summed = torch.tensor([total])
        torch.distributed.all_reduce(summed)
        total = summed.item()
    record = {
        "launcher": state.launcher,
        "rank": state.process_index,
        "world": state.num_processes,
        "local_rank": state.local_process_index,
        "local_world": state.local_num_processes,
        "node_rank": state.node_rank,
        "node": os.environ.get("SLURMD_NODENAME"),
        "sum": total,
    }
    (out / f"{tag}_{state.process_index}.json").write_text(json.dumps(record))


def ddp(out: Path) -> None:
    """Linear regression by SGD: with N processes each takes GLOBAL_BATCH / N samples of a
    step, DDP averages the gradients, so the step equals one process taking all 8."""
    set_seed(0)
    acc = Accelerator(cpu=True, split_batches=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(GLOBAL_BATCH * DDP_STEPS, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(len(x), 1, generator=g)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=DDP_LR)
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    scale = 0.0  # sum over steps of sum_i |per-sample gradient term| (largest element)
    for xb, yb in loader:
        out_b = model(xb)
        with torch.no_grad():  # d mean((wx+b-y)^2) / d(w, b) = sum_i 2 r_i (x_i, 1) / n
            terms = 2 * (out_b - yb).abs() * xb.abs().amax(dim=1, keepdim=True).clamp(min=1)
            scale += terms.sum().item() / len(xb)
        acc.backward(nn.functional.mse_loss(out_b, yb))
        opt.step()
        opt.zero_grad()
    if acc.is_main_process:
        weights = {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
        record = {"weights": weights, "world": acc.num_processes, "scale": scale, "lr": DDP_LR}
        torch.save(record, out / "weights.pt")


def train(project: Path, wait_at: int) -> None:
    from _resumable_train import prepare_and_resume

    project.mkdir(parents=True, exist_ok=True)
    set_seed(0)
    acc = Accelerator(
        cpu=True,
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True
        ),
    )
    model, opt, loader, progress, resumed = prepare_and_resume(acc)
    rank = acc.process_index
    attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
    (project / f"resumed_{attempt}_{rank}").write_text(json.dumps([resumed, progress.step]))
    while progress.epoch < 2:
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
            progress.step += 1
            if progress.step % 3 == 0:
                acc.save_state()
            if resumed is None and progress.step == wait_at:
                acc.should_stop()  # installs the handlers on every rank ...
                acc.wait_for_everyone()  # ... before the test is told to send the signal
                if acc.is_main_process:
                    (project / "ready").write_text(str(progress.step))
                while not acc.should_stop():
                    time.sleep(0.05)
                acc.save_state()
                (project / f"stopped_{rank}").write_text(str(progress.step))
                return
        progress.epoch += 1
    acc.save_model(model, project / "final")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["topology", "ddp", "train"])
    parser.add_argument("out", type=Path)
    parser.add_argument("tag", nargs="?", default="topology")
    parser.add_argument("--wait_at", type=int, default=-1)
    args = parser.parse_args()
    if args.mode == "topology":
        topology(args.out, args.tag)
    elif args.mode == "ddp":
        ddp(args.out)
    else:
        train(args.out, args.wait_at)
    # Close the group together: rank 0 hosts the store, and a process that exits with the
    # group open may abort in its C++ teardown ("terminate called without an active
    # exception") while the others still talk to it.
    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
