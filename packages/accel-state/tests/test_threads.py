"""The shared state per process, or per thread once split (`split_state_per_thread`, for a
process whose replicas are threads): every thread of a normal run reads the process's topology
and notes; after the split each thread has its own, starting empty. The split is for the rest
of the process, so it runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from accel_state import PartialState, state_is_per_thread
from accel_testkit.threads import in_thread

pytestmark = pytest.mark.usefixtures("single_process_state")  # tests/conftest.py


def test_other_threads_of_a_normal_run_see_the_process_state() -> None:
    state = PartialState(cpu=True)
    state.note = "main"
    assert not state_is_per_thread()
    seen = in_thread(lambda: (PartialState._topology, PartialState().note, PartialState().device))
    assert seen == (state.topology, "main", torch.device("cpu"))

    def write() -> None:
        PartialState().other = "thread"

    in_thread(write)
    assert state.other == "thread"  # one set of notes for the process


SPLIT = """\
import threading
import torch
from accel_state import PartialState, split_state_per_thread, state_is_per_thread

PartialState(cpu=True).note = "before"  # the process's: not carried into the threads
split_state_per_thread()
split_state_per_thread()  # idempotent
assert state_is_per_thread()
both = threading.Barrier(2, timeout=60)
seen = {}

def replica(index):
    state = PartialState(device=torch.device("cpu", index))
    state.note = index
    both.wait()  # read after the other thread wrote its own
    seen[index] = (str(PartialState().device), PartialState().note, PartialState._notes)

threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert seen == {0: ("cpu:0", 0, {"note": 0}), 1: ("cpu:1", 1, {"note": 1})}, seen
assert PartialState._topology is None and PartialState._notes == {}  # this thread made none
PartialState._reset_state()  # the reset writes this thread's slots, not the class
assert type(PartialState.__dict__["_topology"]).__name__ == "_PerThread"
print("ok")
"""


def test_split_state_gives_each_thread_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPLIT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
