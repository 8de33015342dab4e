"""A gloo group accel made is destroyed at a normal interpreter exit (a script that never
called end_training), and left alone after an uncaught exception. Two real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accel_state.testing import free_port

SCRIPT = """
import atexit, sys
import torch.distributed as dist

# registered first, so it runs after accel's own exit hook (atexit runs newest first)
atexit.register(lambda: print("at exit: group", "open" if dist.is_initialized() else "closed",
                              flush=True))
from accel_state import PartialState, wait_for_everyone

state = PartialState(cpu=True)
assert state.num_processes == 2 and dist.get_backend() == "gloo"
wait_for_everyone()
if sys.argv[1] == "raise":
    raise RuntimeError("the training loop failed")
"""


def _run(mode: str) -> list[subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, mode],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize(("mode", "code", "group"), [("end", 0, "closed"), ("raise", 1, "open")])
def test_a_gloo_group_is_destroyed_at_a_normal_exit_only(mode: str, code: int, group: str) -> None:
    for run in _run(mode):
        assert run.returncode == code, run.stderr[-3000:]
        assert f"at exit: group {group}" in run.stdout, (run.stdout, run.stderr[-3000:])
