"""A small training loop that survives: resumes from its newest checkpoint, saves every few
steps, and stops at a step boundary on SIGTERM. Run by test_fault_tolerance.py through
`accel launch`.

    python _resumable_train.py PROJECT [--die_rank R --die_at STEP] [--until_stopped]

--die_at: rank R exits abruptly after micro-step STEP, on the first attempt only.
--until_stopped: train (slowly) until a stop is requested; rank 0 writes PROJECT/ready
once the loop is checking for stops.
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


class Progress:
    def __init__(self) -> None:
        self.epoch = 0
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = state["epoch"], state["step"]


def prepare_and_resume(acc: Accelerator) -> tuple:
    """The model, optimizer and loader prepared, a Progress registered for checkpointing, and
    the newest complete checkpoint loaded (its path, or None on a first start)."""
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(48, 4, generator=g), torch.randn(48, 1, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    return model, opt, loader, progress, acc.load_state_if_any()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project")
    parser.add_argument("--die_rank", type=int, default=-1)
    parser.add_argument("--die_at", type=int, default=-1)
    parser.add_argument("--until_stopped", action="store_true")
    args = parser.parse_args()
    project = Path(args.project)
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
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = acc.process_index
    (project / f"pid_{attempt}_{rank}").write_text(str(os.getpid()))
    (project / f"resumed_{attempt}_{rank}").write_text(json.dumps([resumed, progress.step]))
    epochs = 10_000 if args.until_stopped else 2
    while progress.epoch < epochs:
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
            progress.step += 1
            if progress.step % 3 == 0:
                acc.save_state()
            if attempt == 0 and rank == args.die_rank and progress.step == args.die_at:
                os._exit(1)
            if args.until_stopped:
                if acc.should_stop():
                    acc.save_state()
                    (project / f"stopped_{rank}").write_text(str(progress.step))
                    return
                if rank == 0 and progress.step == 2:
                    (project / "ready").write_text("ready")
                time.sleep(0.05)
        progress.epoch += 1
    acc.save_model(model, project / "final")


if __name__ == "__main__":
    main()
