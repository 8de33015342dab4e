"""A gloo group accel made is destroyed at a normal interpreter exit (a script that never
called end_training), and left alone after an uncaught exception. Two real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

RanksRunner = Callable[..., list[subprocess.CompletedProcess]]  # conftest.py's run_ranks

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


@pytest.mark.parametrize(("mode", "code", "group"), [("end", 0, "closed"), ("raise", 1, "open")])
def test_a_gloo_group_is_destroyed_at_a_normal_exit_only(
    mode: str, code: int, group: str, run_ranks: RanksRunner
) -> None:
    for run in run_ranks([sys.executable, "-c", SCRIPT, mode]):
        assert run.returncode == code, run.stderr[-3000:]
        assert f"at exit: group {group}" in run.stdout, (run.stdout, run.stderr[-3000:])
