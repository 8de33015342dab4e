"""A training loop that hangs on purpose, for the hang doctor's tests (run by accel launch).

    python _hang_train.py SCENARIO PROJECT_DIR

skip: rank 0 alone gathers a metric after step 2 (the classic `if is_main_process: gather`).
loader: rank 1's dataset sleeps in __getitem__ at step 3. different: at step 2 rank 0
reduces where rank 1 gathers. killed: rank 1 is killed at step 2 while rank 0 waits for it
in a gather.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

from accel import Accelerator
from accel_testkit.models import RegressionData, loss_of, make_model

SCENARIO, PROJECT = sys.argv[1], sys.argv[2]


class Data(RegressionData):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if SCENARIO == "loader" and RANK == 1 and i >= 12:
            time.sleep(120)  # the stuck data loader
        return super().__getitem__(i)


accelerator = Accelerator(cpu=True, project_dir=PROJECT)
RANK = accelerator.process_index
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(Data(64), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, batch in enumerate(loader):
    loss = loss_of(model, batch)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if SCENARIO == "skip" and step == 2 and accelerator.is_main_process:
        accelerator.gather(loss.detach())
    if SCENARIO == "different" and step == 2:
        if RANK == 0:
            accelerator.reduce(loss.detach())
        else:
            accelerator.gather(loss.detach())
    if SCENARIO == "killed" and step == 2 and RANK == 1:
        threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        time.sleep(5)  # killed here, while rank 0 waits in the gather below
    accelerator.gather(loss.detach())
accelerator.wait_for_everyone()
accelerator.end_training()
