"""The familiar loop on hosts that share no filesystem, launched by test_store_hosts.py: every
checkpoint goes to an object store and comes back from it, and rank 0 writes the run's result
there too, so nothing of the run is on any disk the test (or another host) can read.

    python _store_train.py ddp|fsdp2 RUN OUT [--save_at K] [--resume CKPT] [--auto]

RUN is the run's store prefix (s3://bucket/ddp). --save_at K: save the state after step K
(to RUN/step<K>, or with --auto to ProjectConfiguration(project_dir=RUN,
automatic_checkpoint_naming=True)'s next checkpoint) and train on. --resume CKPT: load that
checkpoint first (with --auto, CKPT is ignored and the newest one under RUN is loaded by
`load_state_if_any`). Either way the run ends at step STEPS and rank 0 writes RUN/OUT.pt: the
final weights, each step's global batch (the samples' indices, gathered from every process),
where it ran, and what its working directory holds.

The loader shuffles (a seeded generator) and 4 global batches make an epoch; K is mid-epoch,
so a resumed run equals the uninterrupted one only when the data position comes back exactly,
into the same epoch's order, and the next epoch's order follows from it. AdamW's eps is above
every gradient element (the step stays about linear in the gradient: accel_testkit.tolerance).
"""

from __future__ import annotations

import argparse
import io
import os
import socket
from pathlib import Path
from typing import Any

import torch

# _multihost_train's network, data and optimizer settings (this script's folder is the first
# entry of its import path, and the tests put it there to import this module)
from _multihost_train import ADAM_EPS, CLIP, GLOBAL_BATCH, LR, SAMPLES, make_net
from _multihost_train import dataset as _samples
from torch import nn

STEPS, LAYERS = 7, 3  # more steps than _multihost_train's: the run crosses into a 2nd epoch


def dataset() -> torch.utils.data.TensorDataset:
    """_multihost_train's samples, each with its index (to check the data position)."""
    x, y = _samples().tensors
    return torch.utils.data.TensorDataset(x, y, torch.arange(SAMPLES))


class Progress:
    """The step count, saved with the state (register_for_checkpointing)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def _accelerator(engine: str, project: Any) -> Any:
    from accel import Accelerator
    from accel.utils import FullyShardedDataParallelPlugin

    if engine == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
        return Accelerator(cpu=True, fsdp_plugin=plugin, project_config=project)
    return Accelerator(cpu=True, project_config=project)


def _write(url: str, obj: Any) -> None:
    from accel_bigmodel import stores

    buf = io.BytesIO()
    torch.save(obj, buf)
    if stores.is_url(url):
        stores.write_bytes(url, buf.getvalue())
    else:  # a local run (trying the script by hand)
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        Path(url).write_bytes(buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=["ddp", "fsdp2"])
    parser.add_argument("run")
    parser.add_argument("out")
    parser.add_argument("--save_at", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--auto", action="store_true")
    args = parser.parse_args()
    run = args.run.rstrip("/")

    from accel import ProjectConfiguration

    project = None
    if args.auto:
        project = ProjectConfiguration(project_dir=run, automatic_checkpoint_naming=True)
    acc = _accelerator(args.engine, project)
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, eps=ADAM_EPS)
    batch = GLOBAL_BATCH // acc.num_processes
    loader = torch.utils.data.DataLoader(
        dataset(), batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    model, opt, loader = acc.prepare(net, opt, loader)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    resumed = None
    if args.auto:
        resumed = acc.load_state_if_any()
    elif args.resume:
        resumed = acc.load_state(args.resume)
    start = progress.step
    batches: dict[int, list[int]] = {}
    saved = None
    while progress.step < STEPS:
        for x, y, index in loader:
            acc.backward(nn.functional.mse_loss(model(x), y))
            acc.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()
            progress.step += 1
            batches[progress.step] = sorted(acc.gather(index).tolist())
            if progress.step == args.save_at:
                saved = acc.save_state(None if args.auto else f"{run}/step{args.save_at}")
            if progress.step == STEPS:
                break
    state = {k: v.detach().float().cpu().clone() for k, v in acc.get_state_dict(model).items()}
    # what this process leaves in its working directory (its host's own /tmp/work)
    Path(f"ran-{args.out}-rank{acc.process_index}").write_text(socket.gethostname())
    if acc.is_main_process:
        _write(
            f"{run}/{args.out}.pt",
            {
                "state": state,
                "world": acc.num_processes,
                "start": start,
                "resumed": None if resumed is None else str(resumed),
                "saved": None if saved is None else str(saved),
                "batches": batches,
                "cwd": os.getcwd(),
                "local": sorted(str(p) for p in Path.cwd().rglob("*")),
            },
        )
    acc.end_training()


if __name__ == "__main__":
    main()
