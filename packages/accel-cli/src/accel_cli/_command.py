"""Turn a resolved `LaunchConfig` into the command line and environment of the child.

One process in all: the script runs directly under the same Python (fastest start). More
than one, or a torchrun option (tee, log_dir, role, restarts, ...): `python -m
torch.distributed.run` with the per-machine process count and the rendezvous, so multi-node,
restarts and elasticity (`--nnodes MIN:MAX` on a c10d rendezvous) are torchrun's. With
`mpirun_hostfile`: mpirun.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from accel_cli._config import ConfigError
from accel_cli._deepspeed import deepspeed_command, uses_deepspeed_runner
from accel_cli._environment import (
    ENV_ACCEL_CONFIG,
    ENV_AS_ACCELERATE,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_DEBUG_MODE,
    ENV_DISABLE_SHARED_STORE,
    ENV_KMP_AFFINITY,
    ENV_KMP_BLOCKTIME,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NCCL_TRACE_BUFFER,
    ENV_OMP_NUM_THREADS,
    NCCL_TRACE_ENTRIES,
)
from accel_cli._launch_config import LaunchConfig
from accel_cli._operators import READ_VARIABLES as OPERATOR_VARIABLES

DEFAULT_MAIN_PROCESS_PORT = 29500
LOOPBACK = "127.0.0.1"
# The shim that pins a worker to its share of the cores, then runs the real program.
AFFINITY_MODULE = "accel_cli._affinity"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def with_rendezvous(config: LaunchConfig, machines_port: int | None = None) -> LaunchConfig:
    """Fill in the rendezvous address and port where the user left them open.

    One machine: loopback and a free port, so concurrent launches do not collide. Several:
    the port every machine agrees on by default (the address is required): `machines_port`
    when given (one derived from a SLURM job), else 29500.
    """
    if not config.distributed:
        return config
    ip = config.main_process_ip or LOOPBACK
    port = config.main_process_port
    if port is None and config.num_machines == 1:
        port = free_port()
    elif port is None:
        port = machines_port or DEFAULT_MAIN_PROCESS_PORT
    return dataclasses.replace(config, main_process_ip=ip, main_process_port=port)


def worker_program(
    config: LaunchConfig,
    target: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    python: str | None = None,
) -> list[str]:
    """What each worker runs: `python script`, `python -m module` or the program itself
    (`no_python`), behind the CPU-affinity shim when `enable_cpu_affinity` is set."""
    python = python or sys.executable
    if config.enable_cpu_affinity:
        mode = "program" if config.no_python else "module" if module else "script"
        return [python, "-m", AFFINITY_MODULE, mode, target, *args]
    if config.no_python:
        return [target, *args]
    return [python, *(["-m", target] if module else [target]), *args]


def build_command(
    config: LaunchConfig,
    target: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    python: str | None = None,
    mpirun: tuple[str, str] | None = None,
    local_addr: str | None = None,
    rdzv_host: bool = False,
) -> list[str]:
    """The argv of the child: the script itself, torchrun around it, or mpirun around it.

    `config` must have its rendezvous filled in (`with_rendezvous`) when it is distributed.
    `mpirun` is (path, "openmpi" | "hydra") for `mpirun_hostfile` runs (default: `find_mpirun`).
    `local_addr`: this machine's address toward the main one (torchrun's --local-addr, which
    its agents advertise to each other instead of the host name, which may resolve to a
    loopback address on the other machines). `rdzv_host`: this machine holds the address of
    a dynamic rendezvous's endpoint (torchrun tells by the host name's addresses alone and
    misses one on a second interface: then no machine would host the store).
    """
    python = python or sys.executable
    if uses_deepspeed_runner(config):
        if config.elastic:
            raise ConfigError(
                f"num_machines={config.nnodes} is an elastic range, which DeepSpeed's runner "
                f"does not form: set deepspeed_multinode_launcher: standard (torchrun on each "
                f"machine), or give one number of machines."
            )
        return deepspeed_command(config, target, args, module=module, python=python)
    program = worker_program(config, target, args, module=module, python=python)
    if config.mpirun_hostfile is not None:
        return mpirun_command(config, program, mpirun or find_mpirun())
    if not config.distributed:
        return program
    assert config.main_process_ip and config.main_process_port, "call with_rendezvous first"
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(config.nproc_per_node),
        "--nnodes",
        config.nnodes,
        "--node-rank",
        str(config.machine_rank),
    ]
    if local_addr is not None:
        cmd += ["--local-addr", local_addr]
    endpoint = f"{config.main_process_ip}:{config.main_process_port}"
    if config.rdzv_backend == "static" and (config.num_machines == 1 or config.same_network):
        cmd += ["--master-addr", config.main_process_ip]
        cmd += ["--master-port", str(config.main_process_port)]
    else:
        cmd += ["--rdzv-backend", config.rdzv_backend, "--rdzv-endpoint", endpoint]
    rdzv_conf = config.rdzv_conf
    if rdzv_host and config.rdzv_backend != "static" and "is_host" not in rdzv_conf:
        rdzv_conf = ",".join(filter(None, (rdzv_conf, "is_host=1")))
    if rdzv_conf:
        cmd += ["--rdzv-conf", rdzv_conf]
    if config.rdzv_id is not None:
        cmd += ["--rdzv-id", config.rdzv_id]
    if config.max_restarts:
        cmd += ["--max-restarts", str(config.max_restarts)]
    if config.monitor_interval != 0.1:
        cmd += ["--monitor-interval", str(config.monitor_interval)]
    if config.role != "default":
        cmd += ["--role", config.role]
    if config.log_dir is not None:
        cmd += ["--log-dir", config.log_dir]
    if config.tee != "0":
        cmd += ["--tee", config.tee]
    if program[0] == python:  # torchrun starts `python -u` itself
        return [*cmd, *program[1:]]
    return [*cmd, "--no-python", *program]


def _mpi_version(name: str) -> str:
    return subprocess.run([name, "--version"], capture_output=True, text=True, timeout=30).stdout


def find_mpirun(
    which: Callable[[str], Any] | None = None, version: Callable[[str], Any] | None = None
) -> tuple[str, str]:
    """(name, flavour) of the MPI launcher on PATH: "openmpi", or "hydra" (MPICH, Intel MPI,
    MVAPICH), told apart by what `version(name)` prints. Raises ConfigError naming what to
    install when there is none. `which` / `version`: lookups to use instead (accelerate's
    tests replace them)."""
    which, version = which or shutil.which, version or _mpi_version
    for name in ("mpirun", "mpiexec"):
        if which(name):
            try:
                printed = version(name)
            except (OSError, subprocess.SubprocessError):
                printed = ""
            if isinstance(printed, bytes):
                printed = printed.decode(errors="replace")
            return name, "openmpi" if "Open MPI" in printed else "hydra"
    raise ConfigError(
        "--mpirun_hostfile needs mpirun (or mpiexec) on PATH and there is none. Install an MPI: "
        "Open MPI (`apt install openmpi-bin` or `conda install openmpi`), MPICH (`apt install "
        "mpich`) or Intel MPI, or drop --mpirun_hostfile to start the CPU processes with torchrun."
    )


def mpirun_command(
    config: LaunchConfig, program: Sequence[str], mpirun: tuple[str, str]
) -> list[str]:
    """mpirun starting `program` on every host of the hostfile, with the rendezvous and the
    launch configuration exported to each process: Open MPI's by name (`-x`); Hydra's (Intel
    MPI, MPICH, MVAPICH) pass the whole environment by default, so the command is accelerate's,
    `program` right after the process counts."""
    path, flavour = mpirun
    hostfile = os.path.expanduser(config.mpirun_hostfile or "")
    per_node, total = str(config.nproc_per_node), str(config.num_processes)
    if flavour == "openmpi":
        exported = (ENV_ACCEL_CONFIG, ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_OMP_NUM_THREADS)
        cmd = [path, "--hostfile", hostfile, "--npernode", per_node, "-n", total]
        exported += (ENV_DEBUG_MODE,) if config.debug else ()
        for name in exported + ((ENV_AS_ACCELERATE,) if config.as_accelerate else ()):
            cmd += ["-x", name]
    else:
        cmd = [path, "-f", hostfile, "-ppn", per_node, "-n", total]
    return [*cmd, *program]


def build_env(
    config: LaunchConfig, environ: Mapping[str, str], *, cpu_cores: int | None = None
) -> dict[str, str]:
    """The child's environment: the caller's, plus the launch JSON and the few variables
    torchrun and the devices need (with a dynamic rendezvous, a new store for the workers of
    each rendezvous round, so that machines can join a running job).

    Threads: `num_cpu_threads_per_process` when given; else an inherited OMP_NUM_THREADS is
    kept; else CPU runs of several processes split `cpu_cores` between them and accelerator
    runs use 1 thread per process (torchrun's own default, without its warning banner).

    The PET_ variables that the resolution read (`_operators.READ_VARIABLES`) are left out:
    torchrun gets their resolved values as flags.
    """
    env = {k: v for k, v in environ.items() if k not in OPERATOR_VARIABLES}
    env[ENV_ACCEL_CONFIG] = json.dumps(config.to_worker_dict(), sort_keys=True)
    if config.debug:
        env[ENV_DEBUG_MODE] = "1"
    if config.as_accelerate:
        env[ENV_AS_ACCELERATE] = "1"
    if config.hang_timeout is not None and not config.cpu:
        env.setdefault(ENV_NCCL_TRACE_BUFFER, NCCL_TRACE_ENTRIES)  # NCCL's Flight Recorder
    if config.mpirun_hostfile is not None and config.main_process_port is not None:
        env[ENV_MASTER_ADDR] = config.main_process_ip or LOOPBACK
        env[ENV_MASTER_PORT] = str(config.main_process_port)
    if config.gpu_id_list is not None:
        env[ENV_CUDA_VISIBLE_DEVICES] = config.gpu_ids
    if config.distributed and config.rdzv_backend != "static":
        env.setdefault(ENV_DISABLE_SHARED_STORE, "1")  # see _environment
    if config.cpu:  # Intel OpenMP's thread placement, as accelerate sets it for CPU runs
        env.setdefault(ENV_KMP_AFFINITY, "granularity=fine,compact,1,0")
        env.setdefault(ENV_KMP_BLOCKTIME, "1")
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


def visible_gpus(environ: Mapping[str, str]) -> int:
    """How many GPUs the workers would see. Without an NVIDIA or ROCm driver this answers 0
    without importing torch; otherwise torch counts them (honouring CUDA_VISIBLE_DEVICES)."""
    nvidia = glob.glob("/proc/driver/nvidia/gpus/*") or glob.glob("/dev/nvidia[0-9]*")
    if not nvidia and not os.path.exists("/dev/kfd"):
        return 0
    if environ.get(ENV_CUDA_VISIBLE_DEVICES, None) in ("", "-1"):
        return 0
    import torch

    return torch.cuda.device_count()
