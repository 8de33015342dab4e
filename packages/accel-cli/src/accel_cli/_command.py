"""Turn a resolved `LaunchConfig` into the command line and environment of the child.

One process in all: the script runs directly under the same Python (fastest start). More
than one: `python -m torch.distributed.run` with the per-machine process count and the
rendezvous, so multi-node, restarts and elasticity are torchrun's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence

from accel_cli._environment import ENV_ACCEL_CONFIG, ENV_CUDA_VISIBLE_DEVICES, ENV_OMP_NUM_THREADS
from accel_cli._resolve import LaunchConfig

DEFAULT_MAIN_PROCESS_PORT = 29500
LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def with_rendezvous(config: LaunchConfig) -> LaunchConfig:
    """Fill in the rendezvous address and port where the user left them open.

    One machine: loopback and a free port, so concurrent launches do not collide. Several:
    the port every machine agrees on by default (the address is required).
    """
    if not config.distributed:
        return config
    ip = config.main_process_ip or LOOPBACK
    port = config.main_process_port
    if port is None:
        port = free_port() if config.num_machines == 1 else DEFAULT_MAIN_PROCESS_PORT
    return dataclasses.replace(config, main_process_ip=ip, main_process_port=port)


def build_command(
    config: LaunchConfig,
    target: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    python: str | None = None,
) -> list[str]:
    """The argv of the child: the script itself, or torchrun around it.

    `config` must have its rendezvous filled in (`with_rendezvous`) when it is distributed.
    """
    python = python or sys.executable
    script = ["-m", target] if module else [target]
    if not config.distributed:
        return [python, *script, *args]
    assert config.main_process_ip and config.main_process_port, "call with_rendezvous first"
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(config.nproc_per_node),
        "--nnodes",
        str(config.num_machines),
        "--node-rank",
        str(config.machine_rank),
    ]
    if config.rdzv_backend == "static":
        cmd += ["--master-addr", config.main_process_ip]
        cmd += ["--master-port", str(config.main_process_port)]
    else:
        cmd += ["--rdzv-backend", config.rdzv_backend]
        cmd += ["--rdzv-endpoint", f"{config.main_process_ip}:{config.main_process_port}"]
    if config.max_restarts:
        cmd += ["--max-restarts", str(config.max_restarts)]
    return [*cmd, *script, *args]


def build_env(
    config: LaunchConfig, environ: Mapping[str, str], *, cpu_cores: int | None = None
) -> dict[str, str]:
    """The child's environment: the caller's, plus the launch JSON and the few variables
    torchrun and the devices need.

    Threads: `num_cpu_threads_per_process` when given; else an inherited OMP_NUM_THREADS is
    kept; else CPU runs of several processes split `cpu_cores` between them and accelerator
    runs use 1 thread per process (torchrun's own default, without its warning banner).
    """
    env = dict(environ)
    env[ENV_ACCEL_CONFIG] = json.dumps(config.to_worker_dict(), sort_keys=True)
    if config.gpu_id_list is not None:
        env[ENV_CUDA_VISIBLE_DEVICES] = config.gpu_ids
    threads = config.num_cpu_threads_per_process
    if threads is None and ENV_OMP_NUM_THREADS not in env and config.nproc_per_node > 1:
        threads = max(1, (cpu_cores or 1) // config.nproc_per_node) if config.cpu else 1
    if threads is not None:
        env[ENV_OMP_NUM_THREADS] = str(threads)
    return env


def physical_cores() -> int:
    """Physical CPU cores of this machine (logical ones when psutil cannot tell)."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1
