"""The Accelerator's shared state (PartialState, AcceleratorState, GradientState) belongs to the
process in a normal run, so every thread reads it (a data loader's, a callback's); where the
state is split per thread (torch-xla running replicas as threads: test_xla_launchers.py runs
that for real), each thread's Accelerator has its own. The split lasts for the rest of the
process, so it runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from accel import Accelerator, AcceleratorState, GradientState, PartialState
from accel_state import state_is_per_thread
from accel_testkit.launch import worker_env
from accel_testkit.threads import in_thread


@pytest.fixture(autouse=True)
def _fresh_state():
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_a_normal_runs_state_is_seen_from_another_thread() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=3)
    accelerator.state.note = "main"
    assert not state_is_per_thread()

    def read() -> tuple[Any, ...]:
        state = AcceleratorState()
        return (
            PartialState().device, state.process_index, state.mixed_precision, state.note,
            state.initialized, GradientState().num_steps, AcceleratorState._shared_state,
        )  # fmt: skip

    seen = in_thread(read)
    assert seen == (
        accelerator.device, 0, "bf16", "main", True, 3, AcceleratorState._shared_state
    )  # fmt: skip

    def write() -> None:
        GradientState()._set_sync_gradients(False)

    in_thread(write)
    assert not accelerator.sync_gradients  # one gradient state for the process


SPLIT = """\
import threading
from accel import Accelerator, AcceleratorState, GradientState, PartialState
from accel_state import split_state_per_thread

Accelerator(cpu=True, mixed_precision="bf16")  # the process's: not carried into the threads
split_state_per_thread()
both = threading.Barrier(2, timeout=120)
seen = {}

def replica(index):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=index + 1)
    accelerator.state.note = index
    accelerator.gradient_state._set_sync_gradients(bool(index))
    both.wait()  # read after the other thread wrote its own
    state = AcceleratorState()
    seen[index] = (
        state.initialized, state.mixed_precision, state.note, GradientState().num_steps,
        GradientState().sync_gradients, accelerator.strategy is state._choices["strategy"],
    )
    if index == 0:
        AcceleratorState._reset_state()  # forgets this thread's records only
        seen["reset"] = AcceleratorState._shared_state
    both.wait()
    seen[index, "after"] = bool(AcceleratorState._shared_state)

threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert seen == {
    0: (True, "no", 0, 1, False, True), 1: (True, "no", 1, 2, True, True),
    "reset": {}, (0, "after"): False, (1, "after"): True,
}, seen
# this thread's state was made before the split: it sees none now
assert AcceleratorState._shared_state == {} and GradientState._shared_state == {}
assert PartialState._topology is None
print("ok")
"""


def test_split_state_gives_each_threads_accelerator_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPLIT], env=worker_env(drop=["ACCEL_*"]),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
