"""The environment variables accel-cli reads or writes, named once.

The launcher reads only `ACCEL_CONFIG_FILE`, `XDG_CONFIG_HOME`, `OMP_NUM_THREADS` and
`ACCEL_USE_CPU` / `ACCELERATE_USE_CPU`, besides the launch's topology where a scheduler or an
operator sets it (SLURM's variables: `_slurm`; a Kubernetes operator's, torchrun's PET_ ones
among them: `_operators`), and writes only what torchrun needs plus the variables below, so a
worker sees one resolved configuration instead of dozens of variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# Written for the workers: the resolved launch configuration as one JSON object. Must equal
# accel_state._environment.ENV_ACCEL_CONFIG (a test holds the two together).
ENV_ACCEL_CONFIG = "ACCEL_LAUNCH_CONFIG"
# Read: the path of the default config file, overriding the XDG location.
ENV_CONFIG_FILE = "ACCEL_CONFIG_FILE"
# Read: the base folder of per-user configuration (XDG Base Directory spec).
ENV_XDG_CONFIG_HOME = "XDG_CONFIG_HOME"
# Written for --gpu_ids; read by `accel env`.
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# Read and written: threads per worker.
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"
# Written for --debug: accel-state checks shapes before collectives. Must equal
# accel_state._ops.ENV_DEBUG_MODE (a test holds the two together).
ENV_DEBUG_MODE = "ACCEL_DEBUG_MODE"
# Written for --as_accelerate: the workers' `import accelerate` gets accel (read at interpreter
# start by accel's start-up hook). Must equal accel._as_accelerate.ENV_AS_ACCELERATE (a test
# holds the two together).
ENV_AS_ACCELERATE = "ACCEL_AS_ACCELERATE"
# Written for CPU runs (unless already set): Intel OpenMP's thread placement.
ENV_KMP_AFFINITY = "KMP_AFFINITY"
ENV_KMP_BLOCKTIME = "KMP_BLOCKTIME"
# Read: run on the CPU even with --multi_gpu or GPUs visible (accel's and accelerate's names).
ENV_USE_CPU = ("ACCEL_USE_CPU", "ACCELERATE_USE_CPU")
# The rendezvous of workers started by mpirun (accel-state reads them).
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
# torchrun's agent: "1" gives the workers of each rendezvous round a new store (on a free port
# of the first machine) instead of one the agent shares across rounds; set for a dynamic
# rendezvous (c10d, etcd), where a machine that joins a later round never learns the shared
# store's address from torch and waits forever.
ENV_DISABLE_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# Written for --hang_timeout on GPU runs (unless set): NCCL's Flight Recorder keeps this many
# collectives, which the hang doctor dumps beside its report.
ENV_NCCL_TRACE_BUFFER = "TORCH_NCCL_TRACE_BUFFER_SIZE"
NCCL_TRACE_ENTRIES = "2000"

DEFAULT_CONFIG_NAME = "default_config.yaml"


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the default config file lives (it need not exist).

    `$ACCEL_CONFIG_FILE` if set, else `$XDG_CONFIG_HOME/accel/default_config.yaml`, else
    `~/.config/accel/default_config.yaml`.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_CONFIG_FILE)
    if explicit:
        return Path(explicit).expanduser()
    base = env.get(ENV_XDG_CONFIG_HOME)
    if not base:
        home = env.get("HOME") or str(Path.home())
        base = str(Path(home) / ".config")
    return Path(base).expanduser() / "accel" / DEFAULT_CONFIG_NAME


_TRUE = ("1", "true", "yes", "y", "on", "t")


def env_wants_cpu(environ: Mapping[str, str]) -> bool:
    """Whether $ACCEL_USE_CPU or $ACCELERATE_USE_CPU asks for a CPU run."""
    return any(str(environ.get(name, "")).strip().lower() in _TRUE for name in ENV_USE_CPU)
