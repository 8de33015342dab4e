"""Start a training function in several processes from Python (notebooks, tests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from accel._compat._environment import environment
from accel_state import ENV_ACCEL_CONFIG

# accelerate refuses to fork after these were imported (they initialize the device on import)
_INITIALIZE_DEVICE_ON_IMPORT = ("bitsandbytes",)


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
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run `function(*args)` in `num_processes` processes on this machine (forked, so functions
    defined in a notebook work; CUDA must not be initialized before). One process: called here.

    Several processes (and `num_nodes` machines) start through torch's elastic agent, as
    torchrun's workers: `rdzv_backend` ("static" or "c10d"), `rdzv_endpoint` (default
    `master_addr:use_port`), `rdzv_conf`, `rdzv_id`, `max_restarts` (restarts of the whole
    group after a failure), `monitor_interval` (seconds between the agent's checks of its
    workers) and `log_line_prefix_template` mean what they mean there. A worker's failure
    raises torch's `ChildFailedError` here.

    Where torch-xla has a device (a TPU; `PJRT_DEVICE` set), the function runs once per XLA
    device through torch-xla's launcher instead (`accel._xla_launcher`).
    """
    import torch

    from accel_state import PrecisionType

    try:
        mixed_precision = PrecisionType(str(mixed_precision).lower()).value
    except ValueError:
        raise ValueError(
            f"Unknown mixed_precision mode: {mixed_precision!r}. Choose between "
            f"{[p.value for p in PrecisionType]}."
        ) from None
    if node_rank >= num_nodes:
        raise ValueError("The node_rank must be less than the number of nodes.")
    from accel_parallel import xla_requested

    if xla_requested(os.environ):  # XLA devices (TPU): torch-xla's launcher, see _xla_launcher
        from accel._xla_launcher import launch_on_xla

        config = {"mixed_precision": mixed_precision}
        return launch_on_xla(function, args, num_processes, config)
    if num_processes is None:
        num_processes = max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1
    config = {"mixed_precision": mixed_precision, "num_processes": num_processes * num_nodes}
    if num_processes == 1 and num_nodes == 1:
        with environment({ENV_ACCEL_CONFIG: json.dumps(config)}):
            function(*args)
        return
    _check_can_fork()
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    rdzv_conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        rdzv_conf["rank"] = node_rank
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    launch = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=num_processes,
        run_id=rdzv_id,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        rdzv_configs=rdzv_conf,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        log_line_prefix_template=log_line_prefix_template,
    )
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(use_port),
        ENV_ACCEL_CONFIG: json.dumps(config),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    with environment(env, whole=True):  # the forked workers inherit it
        elastic_launch(config=launch, entrypoint=function)(*args)


def _check_can_fork() -> None:
    """accelerate's refusals before forking workers: an Accelerator made in this process, a
    library that initializes the device on import, CUDA already initialized."""
    import sys

    import torch

    from accel._accelerator_state import AcceleratorState

    if AcceleratorState._shared_state:
        raise ValueError(
            "To launch a multi-device training from your notebook, the `Accelerator` should only "
            "be initialized inside your training function. Restart your notebook and make sure "
            "no cells initializes an `Accelerator`."
        )
    problematic = [name for name in _INITIALIZE_DEVICE_ON_IMPORT if name in sys.modules]
    if problematic:
        raise RuntimeError(
            "Could not start distributed process. Libraries known to initialize device upon "
            "import have been imported already. Please keep these imports inside your training "
            "function to try and help with this:" + "".join(f"\n\t* `{n}`" for n in problematic)
        )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was initialized in this process before notebook_launcher, so it cannot fork "
            "workers. Restart the notebook and do not touch CUDA before calling it."
        )


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
