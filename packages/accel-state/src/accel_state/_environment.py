"""Reading the launcher's environment: the one place accel-state looks at os.environ.

Each launcher (torchrun / torchelastic, SLURM, Open MPI, MPICH / Intel MPI) describes the
process topology with its own variables. `detect_launch(environ)` turns any of them into one
`LaunchInfo`. It is a pure function of the mapping it is given, so it is tested with plain dicts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

# torchrun / torchelastic
# Read on each collective: "1"/"true"/"yes"/"on" switches the shape checks on.
ENV_DEBUG_MODE = "ACCEL_DEBUG_MODE"
ENV_ACCELERATE_DEBUG_MODE = "ACCELERATE_DEBUG_MODE"  # what `accelerate launch --debug` sets
ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_GROUP_RANK = "GROUP_RANK"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
# torchrun's elastic agent: how many times it restarted the workers, and whether the agent
# itself serves the TCPStore at MASTER_ADDR:MASTER_PORT ("True").
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
# SLURM: the tasks of an srun step. The batch script and salloc's interactive shell see
# SLURM_PROCID / SLURM_NTASKS too (0 and the job's task count) but are one process: the
# step id tells them apart (absent in the batch script, a reserved id in salloc's shell).
ENV_SLURM_PROCID = "SLURM_PROCID"
ENV_SLURM_NTASKS = "SLURM_NTASKS"
ENV_SLURM_LOCALID = "SLURM_LOCALID"
ENV_SLURM_STEP_ID = "SLURM_STEP_ID"
ENV_SLURM_STEPID = "SLURM_STEPID"  # the older spelling, set beside SLURM_STEP_ID
# Tasks per node of the step, one entry per node in node order, compressed: "2(x3),1".
ENV_SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
ENV_SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
# --ntasks-per-node of the job: inherited by every step, so a step of other shape sees a
# stale value; read only when neither list above is set.
ENV_SLURM_NTASKS_PER_NODE = "SLURM_NTASKS_PER_NODE"
ENV_SLURM_NODEID = "SLURM_NODEID"  # this node's index among the step's nodes
ENV_SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"  # the step's nodes; task 0 runs on the first
ENV_SLURM_NODELIST = "SLURM_JOB_NODELIST"
ENV_SLURM_NODELIST_OLD = "SLURM_NODELIST"
ENV_SLURM_JOB_ID = "SLURM_JOB_ID"
# Step ids above this one are SLURM's reserved steps (batch script, extern, interactive,
# pending: 0xfffffffa-0xfffffffd today, 0xfffffffe-0xffffffff before 20.11); srun's steps
# count up from 0.
SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0
# Open MPI
ENV_OMPI_RANK = "OMPI_COMM_WORLD_RANK"
ENV_OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
ENV_OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
ENV_OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"
# MPICH / Intel MPI (Hydra process manager)
ENV_PMI_RANK = "PMI_RANK"
ENV_PMI_SIZE = "PMI_SIZE"
ENV_MPI_LOCALRANKID = "MPI_LOCALRANKID"
ENV_MPI_LOCALNRANKS = "MPI_LOCALNRANKS"
# MVAPICH
ENV_MV2_RANK = "MV2_COMM_WORLD_RANK"
ENV_MV2_SIZE = "MV2_COMM_WORLD_SIZE"
ENV_MV2_LOCAL_RANK = "MV2_COMM_WORLD_LOCAL_RANK"

# The resolved configuration that `accel launch` hands to its workers (a JSON document).
ENV_ACCEL_CONFIG = "ACCEL_LAUNCH_CONFIG"

# accelerate's variable naming the device outright (e.g. "cuda:1", "cpu"); it wins over the
# device accel would pick, as in accelerate.
ENV_TORCH_DEVICE = "ACCELERATE_TORCH_DEVICE"

# XLA devices (torch-xla): accelerate's opt-out ("0" keeps a machine with torch-xla off XLA),
# and torch-xla's runtime device ("TPU", "CPU", ...). set_seed seeds XLA's generator by them.
ENV_USE_TORCH_XLA = "USE_TORCH_XLA"
ENV_PJRT_DEVICE = "PJRT_DEVICE"

DEFAULT_MASTER_PORT = 29500


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits, as the launcher described it."""

    launcher: str  # "torchrun", "slurm", "openmpi", "mpich", "mvapich" or "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    # Set under torchrun's elastic agent: the restart attempt (0 for the first start) and
    # whether the agent serves the store at master_addr:master_port.
    restart_count: int | None = None
    agent_store: bool = False


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"Environment variable {name}={raw!r} is not an integer. The launcher sets it to a "
            f"number; unset it or fix the launch command."
        ) from None


def first_slurm_host(nodelist: str) -> str:
    """Return the first host of a SLURM node list such as ``gpu[003-006,009],cpu01``."""
    match = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"Cannot parse the SLURM node list {nodelist!r}.")
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}"


def _master(environ: Mapping[str, str]) -> tuple[str | None, int | None]:
    return environ.get(ENV_MASTER_ADDR) or None, _int(environ, ENV_MASTER_PORT)


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of an srun step (not the batch script, not salloc's
    interactive shell, not a process outside SLURM)."""
    name = ENV_SLURM_STEP_ID if environ.get(ENV_SLURM_STEP_ID) else ENV_SLURM_STEPID
    step = _int(environ, name)
    return step is not None and 0 <= step < SLURM_MAX_NORMAL_STEP_ID


def expand_tasks_per_node(value: str) -> list[int]:
    """SLURM's compressed per-node counts, one per node: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(
                f"Cannot read the SLURM task count {item!r} in {value!r}: expected entries "
                f"like '2' or '2(x3)'. Unset the variable or fix the launch command."
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _slurm_local_world(environ: Mapping[str, str], node: int) -> int:
    """How many tasks of the step run on this node: the entry for SLURM_NODEID in the step's
    per-node list, else --ntasks-per-node, else 1."""
    for name in (ENV_SLURM_STEP_TASKS_PER_NODE, ENV_SLURM_TASKS_PER_NODE):
        if environ.get(name):
            counts = expand_tasks_per_node(environ[name])
            if not 0 <= node < len(counts):
                raise ValueError(
                    f"{ENV_SLURM_NODEID}={node} has no entry in {name}={environ[name]!r} "
                    f"({len(counts)} nodes). The launcher sets both; unset them or fix the "
                    f"launch command."
                )
            return counts[node]
    return _int(environ, ENV_SLURM_NTASKS_PER_NODE, 1)


def detect_launch(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """Describe the process topology from the environment of a known launcher.

    torchrun's variables win over SLURM's (torchrun started inside an allocation), and SLURM's
    over MPI's. SLURM's count only in the tasks of an srun step: the batch script and
    salloc's shell are one process, whatever SLURM_NTASKS says. With no launcher variables
    the process is alone.
    """
    env = os.environ if environ is None else environ
    addr, port = _master(env)
    if ENV_RANK in env and ENV_WORLD_SIZE in env:
        world = _int(env, ENV_WORLD_SIZE)
        local_world = _int(env, ENV_LOCAL_WORLD_SIZE, world)
        return LaunchInfo(
            launcher="torchrun",
            rank=_int(env, ENV_RANK),
            world_size=world,
            local_rank=_int(env, ENV_LOCAL_RANK, 0),
            local_world_size=local_world,
            node_rank=_int(env, ENV_GROUP_RANK, 0),
            master_addr=addr,
            master_port=port,
            restart_count=_int(env, ENV_RESTART_COUNT),
            agent_store=env.get(ENV_USE_AGENT_STORE) == "True",
        )
    if ENV_SLURM_PROCID in env and ENV_SLURM_NTASKS in env and in_slurm_step(env):
        nodelist = (
            env.get(ENV_SLURM_STEP_NODELIST)
            or env.get(ENV_SLURM_NODELIST)
            or env.get(ENV_SLURM_NODELIST_OLD)
        )
        if addr is None and nodelist:
            addr = first_slurm_host(nodelist)
        if port is None and ENV_SLURM_JOB_ID in env:
            # Every task of the job derives the same port from the job id.
            port = 15000 + _int(env, ENV_SLURM_JOB_ID) % 20000
        node = _int(env, ENV_SLURM_NODEID, 0)
        return LaunchInfo(
            launcher="slurm",
            rank=_int(env, ENV_SLURM_PROCID),
            world_size=_int(env, ENV_SLURM_NTASKS),
            local_rank=_int(env, ENV_SLURM_LOCALID, 0),
            local_world_size=_slurm_local_world(env, node),
            node_rank=node,
            master_addr=addr,
            master_port=port,
        )
    for launcher, rank_v, size_v, local_v, local_size_v in (
        ("openmpi", ENV_OMPI_RANK, ENV_OMPI_SIZE, ENV_OMPI_LOCAL_RANK, ENV_OMPI_LOCAL_SIZE),
        ("mvapich", ENV_MV2_RANK, ENV_MV2_SIZE, ENV_MV2_LOCAL_RANK, None),
        ("mpich", ENV_PMI_RANK, ENV_PMI_SIZE, ENV_MPI_LOCALRANKID, ENV_MPI_LOCALNRANKS),
    ):
        if rank_v in env and size_v in env:
            world = _int(env, size_v)
            local_rank = _int(env, local_v, 0)
            local_world = _int(env, local_size_v, 1) if local_size_v else 1
            return LaunchInfo(
                launcher=launcher,
                rank=_int(env, rank_v),
                world_size=world,
                local_rank=local_rank,
                local_world_size=local_world,
                node_rank=_int(env, rank_v) // max(local_world, 1),
                master_addr=addr,
                master_port=port,
            )
    return LaunchInfo(launcher="none", master_addr=addr, master_port=port)


def launch_config(environ: Mapping[str, str] | None = None) -> str | None:
    """The JSON configuration handed down by `accel launch`, if any."""
    env = os.environ if environ is None else environ
    return env.get(ENV_ACCEL_CONFIG) or None


def device_override(environ: Mapping[str, str] | None = None) -> str | None:
    """The device ACCELERATE_TORCH_DEVICE names, or None where it is unset or empty."""
    value = (os.environ if environ is None else environ).get(ENV_TORCH_DEVICE, "").strip()
    return value or None
