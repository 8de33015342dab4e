"""Fixtures of accel-state's tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence

import pytest

from accel_state import PartialState
from accel_state._environment import ENV_ACCEL_CONFIG, ENV_TORCH_DEVICE
from accel_state.testing import free_port

RanksRunner = Callable[..., list[subprocess.CompletedProcess]]


@pytest.fixture
def single_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher's rank, world size, accel config or device override in the environment, and
    no topology before or after the test: a PartialState made in it is one plain process's."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", ENV_ACCEL_CONFIG, ENV_TORCH_DEVICE):
        monkeypatch.delenv(name, raising=False)
    PartialState._reset_state()
    yield
    PartialState._reset_state()


@pytest.fixture
def run_ranks() -> RanksRunner:
    """`run_ranks(argv, timeout=...)`: start `argv` as ranks 0 and 1 of one world on loopback
    with torchrun's variables (no ACCEL_* ones, OMP_NUM_THREADS=1), wait for both, and return
    their completed processes (both killed when one runs past `timeout`)."""

    def run(argv: Sequence[str], timeout: float = 120) -> list[subprocess.CompletedProcess]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        env.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        procs = [
            subprocess.Popen(
                list(argv),
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
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise
            out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
        return out

    return run
