"""Start a training function in several processes from Python (notebooks, tests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from accel_state._environment import ENV_ACCEL_CONFIG


class _Entry:
    """The per-process entry point: sets this process's rendezvous variables, then calls."""

    def __init__(self, function: Callable[..., Any], env: dict[str, str], world: int) -> None:
        self.function = function
        self.env = env
        self.world = world

    def __call__(self, rank: int, *args: Any) -> None:
        os.environ.update(self.env)
        os.environ.update(
            {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(self.world)}
        )
        os.environ["LOCAL_WORLD_SIZE"] = str(self.world)
        self.function(*args)


def _start(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    num_processes: int,
    env: dict[str, str],
    start_method: str,
) -> None:
    import torch.multiprocessing as mp

    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes}: must be at least 1.")
    mp.start_processes(
        _Entry(function, env, num_processes),
        args=args,
        nprocs=num_processes,
        start_method=start_method,
        join=True,
    )


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
) -> None:
    """Run `function(*args)` in `num_processes` processes on this machine (forked, so functions
    defined in a notebook work; CUDA must not be initialized before). One process: called here."""
    import torch

    if num_nodes != 1 or node_rank != 0:
        raise ValueError("notebook_launcher runs on one machine; use `accel launch` for several.")
    if num_processes is None:
        num_processes = max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1
    config = {"mixed_precision": mixed_precision, "num_processes": num_processes}
    if num_processes == 1:
        previous = os.environ.get(ENV_ACCEL_CONFIG)
        os.environ[ENV_ACCEL_CONFIG] = json.dumps(config)
        try:
            function(*args)
        finally:
            if previous is None:
                os.environ.pop(ENV_ACCEL_CONFIG, None)
            else:
                os.environ[ENV_ACCEL_CONFIG] = previous
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was initialized in this process before notebook_launcher, so it cannot fork "
            "workers. Restart the notebook and do not touch CUDA before calling it."
        )
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(use_port),
        ENV_ACCEL_CONFIG: json.dumps(config),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    _start(function, args, num_processes, env, "fork")


def debug_launcher(
    function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2
) -> None:
    """Run `function(*args)` in `num_processes` CPU processes (gloo), to debug distributed code."""
    from accel_state.testing import free_port

    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        ENV_ACCEL_CONFIG: json.dumps({"cpu": True, "num_processes": num_processes}),
        "OMP_NUM_THREADS": "1",
    }
    _start(function, args, num_processes, env, "fork")
