"""One rank of the hang doctor's leaf tests, started with torchrun's variables by
test_hang.py: accel-state alone, no launcher, so rank 0 prints the diagnosis.

    python _hang_worker.py SCENARIO FOLDER

different: at step 2 rank 0 reduces where rank 1 gathers. killed: rank 1 is killed at
step 2 while rank 0 waits for it in a gather. stopped: as killed, but first rank 0 gets
SIGTERM in that gather, as a launcher ends the survivors once one worker died. terminated:
rank 0 gets SIGTERM between collectives at step 2.
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
pid_file = os.path.join(FOLDER, "rank0.pid")
if rank == 0:
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
for step in range(5):
    doctor.beat()
    if SCENARIO == "different" and step == 2:
        if rank == 0:
            reduce(x)  # site: reduce
        else:
            gather(x)  # site: different gather
    if SCENARIO == "killed" and step == 2 and rank == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        time.sleep(5)
    if SCENARIO == "stopped" and step == 2 and rank == 1:
        time.sleep(0.3)  # rank 0 is in the gather below
        with open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGTERM)
        time.sleep(0.5)  # rank 0 holds the SIGTERM while its gather waits
        os.kill(os.getpid(), signal.SIGKILL)
    if SCENARIO == "terminated" and step == 2 and rank == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    gather(x)  # site: gather
wait_for_everyone()
doctor.stop()
