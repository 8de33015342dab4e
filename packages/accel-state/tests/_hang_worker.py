"""One rank of the hang doctor's leaf tests, started with torchrun's variables by
test_hang.py: accel-state alone, no launcher, so rank 0 prints the diagnosis.

    python _hang_worker.py SCENARIO FOLDER

different: at step 2 rank 0 reduces where rank 1 gathers. killed: rank 1 is killed at
step 2 while rank 0 waits for it in a gather.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

from accel_state import PartialState, gather, reduce, wait_for_everyone
from accel_state.hang import HangDoctor, process_group_store

SCENARIO, FOLDER = sys.argv[1], sys.argv[2]
state = PartialState(cpu=True)
rank = state.process_index
doctor = HangDoctor(
    2.0, rank=rank, world_size=state.num_processes, folder=FOLDER, store=process_group_store()
).start()
x = torch.ones(3, 2)
for step in range(5):
    doctor.beat()
    if SCENARIO == "different" and step == 2:
        if rank == 0:
            reduce(x)
        else:
            gather(x)
    if SCENARIO == "killed" and step == 2 and rank == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        time.sleep(5)
    gather(x)
wait_for_everyone()
doctor.stop()
