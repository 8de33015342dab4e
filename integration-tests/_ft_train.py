"""One replica group's training for test_replica_groups.py: `accel launch --ft_*` gives the
FaultTolerancePlugin. Trains until the run's (the groups') step reaches STEPS and writes, per
rank, one JSON line per optimizer step and the final weights and optimizer state.

argv: OUT STEPS PACE_SECONDS [SAVE_DIR]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator

out, steps, pace = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
save_dir = sys.argv[4] if len(sys.argv) > 4 else None

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000, gamma=0.5)
ids = torch.arange(4096)
g = torch.Generator().manual_seed(1)
x = torch.randn(4096, 8, generator=g)
y = x.sum(dim=1, keepdim=True).sin()
loader = DataLoader(TensorDataset(ids, x, y), batch_size=2, shuffle=False)

accelerator = Accelerator()
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
strategy = accelerator.strategy
group, rank = strategy.plugin.replica_group_id, accelerator.process_index
log = (out / f"g{group}_r{rank}.jsonl").open("a")
start = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
trajectory = []


def batches():
    while True:
        yield from loader


for batch_ids, xb, yb in batches():
    if strategy.current_step >= steps:
        break
    t0 = time.time()
    loss = nn.functional.mse_loss(model(xb), yb)
    before = strategy.current_step  # after the step's quorum: a healed group's is its peers'
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    record = {
        "step": before,
        "after": strategy.current_step,
        "skipped": optimizer.step_was_skipped,
        "ids": batch_ids.tolist(),
        "loss": loss.item(),
        "participants": strategy.manager.num_participants(),
        "t0": t0,
        "t1": time.time(),
    }
    log.write(json.dumps(record) + "\n")
    log.flush()
    if not optimizer.step_was_skipped:
        trajectory.append(
            {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
        )
    alone = record["participants"] < strategy.plugin.num_replica_groups
    time.sleep(pace * (4 if alone else 1))  # a survivor alone goes slower (the test waits)

final = {
    "start": start,
    "trajectory": trajectory,
    "model": accelerator.unwrap_model(model).state_dict(),
    "optimizer": optimizer.state_dict(),
    "scheduler": scheduler.state_dict(),
    "writes_checkpoints": strategy.writes_checkpoints,
}
torch.save(final, out / f"g{group}_r{rank}_final.pt")
if save_dir:
    accelerator.save_state(save_dir)
accelerator.end_training()  # stops the manager the strategy started
