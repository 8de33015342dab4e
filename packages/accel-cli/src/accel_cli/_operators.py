"""What `accel launch` takes from a Kubernetes operator's pod: the machines, this pod's rank,
the address of pod 0, the processes per pod, the rendezvous.

torchrun gives every flag a default from `PET_<FLAG>` (torch.distributed.argparse_util's `env`
action: `--nnodes` from PET_NNODES, `--node-rank` from PET_NODE_RANK, ...), and the operators
set those variables instead of writing torchrun's command line. `accel launch` reads them the
same way for its own flags, plus the variables of the operators that predate them:

    num_machines       PET_NNODES ("N", or "MIN:MAX": elastic); else WORLD_SIZE divided by
                       the processes per pod (a PyTorchJob's WORLD_SIZE counts processes)
    num_processes      PET_NPROC_PER_NODE (N, or auto / gpu / cpu as torchrun counts them)
                       times the machines; 1 per pod where WORLD_SIZE gave the machines
    machine_rank       PET_NODE_RANK; else RANK (a PyTorchJob's pod index, with WORLD_SIZE);
                       else JOB_COMPLETION_INDEX (an indexed Job's, with an address below)
    (WORLD_SIZE and RANK are not read where LOCAL_RANK or TORCHELASTIC_RUN_ID says that this
    is a launcher's worker: an `accel launch` started by a torchrun worker is no pod.)
    main_process_ip,   PET_RDZV_ENDPOINT (HOST:PORT); else PET_MASTER_ADDR, PET_MASTER_PORT;
    main_process_port  else MASTER_ADDR, MASTER_PORT
    rdzv_backend, rdzv_id, rdzv_conf, max_restarts, monitor_interval, role, log_dir, tee,
    no_python          PET_RDZV_BACKEND, PET_RDZV_ID, ... (torchrun's flag, upper-cased)

As the operators set them:
- Kubeflow Trainer v2 TrainJob: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's
  completion index), PET_MASTER_ADDR (`<trainjob>-node-0-0.<trainjob>`), PET_MASTER_PORT.
- Kubeflow PyTorchJob (training-operator v1), with a Master replica: MASTER_ADDR
  (`<job>-master-0`), MASTER_PORT, RANK (the pod's index: master 0, worker i is i+1) and
  WORLD_SIZE (pods x nprocPerNode); releases with spec.nprocPerNode also set PET_NNODES,
  PET_NODE_RANK and PET_NPROC_PER_NODE (then PET_NNODES wins and WORLD_SIZE is only checked
  against it). With an
  elasticPolicy: PET_RDZV_ENDPOINT (`<job>-worker-0:PORT`), PET_RDZV_BACKEND (c10d),
  PET_NNODES ("MIN:MAX", or the workers), PET_MAX_RESTARTS.
- JobSet: an indexed Job gives each pod JOB_COMPLETION_INDEX, its rank among the Job's pods,
  and nothing else: JobSet has no variable for pod 0's address (`<jobset>-<job>-0-0.<subdomain>`)
  nor for the number of pods. The manifest names both, as JobSet's own torchrun examples do:
  MASTER_ADDR (or PET_MASTER_ADDR), MASTER_PORT, and PET_NNODES (or --num_machines, or the
  config file). JOB_COMPLETION_INDEX is read only together with such an address, since an
  indexed Job of separate single-pod runs has one too; with an address and no count anywhere,
  the launch stops and says what to set.

Precedence: a flag > these variables > the config file > the defaults. A flag is what this
command says now; the variables are what the operator knows of this job (torchrun takes them
over its own defaults the same way, and lets a flag win); a config file is written once for
many jobs and cannot know this pod's rank or the job's size. A flag --num_machines (or
--nnodes) that differs from the operator's count takes the topology in hand, as inside a
SLURM step: none of the operator's rank, address, processes or rendezvous is taken then, and
a notice names both values. For comparison, accelerate's launch (1.15) reads none of these
for its own flags: on the same two pods (integration-tests/test_operator_pods.py's), plain
`accelerate launch --cpu SCRIPT` ran one process per pod, a world of 1, with each operator's
variables; only the torchrun it starts for several processes takes the PET_ variables that
accelerate leaves unset (README: "Inside Kubernetes operators' pods").

On one machine (PET_NNODES 1) the rank and the address are not taken: the run rendezvouses on
loopback as usual. SLURM's variables are `_slurm`'s; where both are set, these win (they are
torchrun's own flags, set for this launch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from accel_cli._config import ConfigError
from accel_cli._resolve import FromEnvironment, coerce, machine_range

ENV_NNODES = "PET_NNODES"
ENV_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_NODE_RANK = "PET_NODE_RANK"
ENV_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_MASTER_PORT = "PET_MASTER_PORT"
ENV_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
ENV_RDZV_BACKEND = "PET_RDZV_BACKEND"
# A PyTorchJob's (and any env:// launcher's) variables.
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RANK = "RANK"
ENV_PLAIN_MASTER_ADDR = "MASTER_ADDR"
ENV_PLAIN_MASTER_PORT = "MASTER_PORT"
# Set for a launcher's worker (torchrun's), never by an operator: there RANK and WORLD_SIZE
# are a worker's, and an `accel launch` started by that worker is not a pod of a job.
WORKER_VARIABLES = ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")
# An indexed Job's (JobSet's) pod index.
ENV_JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"

# LaunchConfig fields whose torchrun flag is read as PET_<FLAG> with one value, unchanged.
PLAIN_FIELDS = {
    "rdzv_backend": ENV_RDZV_BACKEND,
    "rdzv_id": "PET_RDZV_ID",
    "rdzv_conf": "PET_RDZV_CONF",
    "max_restarts": "PET_MAX_RESTARTS",
    "monitor_interval": "PET_MONITOR_INTERVAL",
    "role": "PET_ROLE",
    "log_dir": "PET_LOG_DIR",
    "tee": "PET_TEE",
}
ENV_NO_PYTHON = "PET_NO_PYTHON"  # torchrun's check_env: an integer, not 0 for true
# The PET_ variables of the flags read here. The torchrun that `accel launch` starts gets the
# resolved values as flags and none of these (`_command.build_env`): a flag that accel leaves
# out (--rdzv-backend on one machine, say) would otherwise take its default from one of them
# behind the resolution's back.
READ_VARIABLES = (
    ENV_NNODES, ENV_NPROC_PER_NODE, ENV_NODE_RANK, ENV_MASTER_ADDR, ENV_MASTER_PORT,
    ENV_RDZV_ENDPOINT, ENV_NO_PYTHON, *PLAIN_FIELDS.values(),
)  # fmt: skip
# What a different --num_machines takes out of the operator's values.
TOPOLOGY = (
    "num_machines",
    "num_processes",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "rdzv_backend",
    "rdzv_id",
    "rdzv_conf",
)
_PER_NODE_WORDS = ("auto", "gpu", "cpu")


def _set(environ: Mapping[str, str], name: str) -> str | None:
    if name in (ENV_WORLD_SIZE, ENV_RANK) and any(environ.get(n) for n in WORKER_VARIABLES):
        return None  # a worker's rank and world, not a pod's
    value = environ.get(name, "").strip()
    return value or None


def processes_per_node(raw: str, variable: str, gpus: Callable[[], int]) -> int:
    """torchrun's --nproc-per-node: N >= 1, or auto (the GPUs, else the CPUs), gpu, cpu."""
    text = raw.strip().lower()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    if text not in _PER_NODE_WORDS:
        raise ConfigError(
            f"{variable}={raw!r}: expected a number of processes per machine (1 or more), or "
            f"auto, gpu or cpu (torchrun's --nproc-per-node)."
        )
    count = 0 if text == "cpu" else gpus()
    if text == "gpu" and count == 0:
        raise ConfigError(
            f"{variable}=gpu: this pod has no GPU visible. Give the pod GPUs, or set "
            f"{variable} to a number of processes."
        )
    return count or len(os.sched_getaffinity(0))


def operator_name(environ: Mapping[str, str]) -> str:
    """Which operator set these variables, as far as they tell (for messages only)."""
    if _set(environ, ENV_RDZV_ENDPOINT):
        return "Kubeflow PyTorchJob, elastic"
    if _set(environ, ENV_WORLD_SIZE) and _set(environ, ENV_RANK):
        return "Kubeflow PyTorchJob"
    if _set(environ, ENV_NODE_RANK) and _set(environ, ENV_MASTER_ADDR):
        return "Kubeflow TrainJob"
    if _set(environ, ENV_JOB_COMPLETION_INDEX):
        return "JobSet"
    return "torchrun's PET_ variables"


def _wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment describes a launch: a PET_ variable of a flag, a PyTorchJob's
    WORLD_SIZE and RANK with an address, or an indexed Job's index with an address."""
    address = _set(environ, ENV_PLAIN_MASTER_ADDR)
    world = _set(environ, ENV_WORLD_SIZE) and _set(environ, ENV_RANK)
    return (
        any(_set(environ, n) for n in READ_VARIABLES)
        or bool(world and address)
        or bool(_set(environ, ENV_JOB_COMPLETION_INDEX) and address)
    )


def operator_launch_values(
    environ: Mapping[str, str], gpus: Callable[[], int] = lambda: 0
) -> FromEnvironment | None:
    """The launch values an operator's variables give (None where none is set). `gpus`
    counts the GPUs this pod sees, for PET_NPROC_PER_NODE=auto or gpu."""
    if not _wanted(environ):
        return None
    source = operator_name(environ)
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    notices: list[str] = []

    def take(field: str, raw: str, variable: str) -> None:
        values[field] = coerce(field, raw, variable)
        names[field] = variable

    for field, variable in PLAIN_FIELDS.items():
        if _set(environ, variable):
            take(field, environ[variable], variable)
    if _set(environ, ENV_NO_PYTHON):
        raw = environ[ENV_NO_PYTHON]
        if not raw.strip().isdigit():
            raise ConfigError(f"{ENV_NO_PYTHON}={raw!r}: expected 0 or 1 (torchrun's --no-python).")
        values["no_python"], names["no_python"] = int(raw) != 0, ENV_NO_PYTHON

    machines, per_node = _machines(environ, gpus, values, names, notices)
    rank_variable = _rank_variable(environ)
    if rank_variable is not None:
        take("machine_rank", environ[rank_variable], rank_variable)
    _address(environ, take, plain=machines is not None or rank_variable is not None)
    if rank_variable is not None and machines is not None and values["machine_rank"] >= machines[1]:
        raise ConfigError(
            f"{rank_variable}={environ[rank_variable]} ({source}) is not below the "
            f"{machines[1]} machines that {names['num_machines']} gives: a pod's rank runs from "
            f"0 to the machines - 1. Fix the manifest, or pass --machine_rank and --num_machines."
        )
    if machines is not None and machines[1] == 1:  # one machine: rendezvous on loopback
        for field in ("machine_rank", "main_process_ip", "main_process_port"):
            values.pop(field, None)
            names.pop(field, None)
    needs = None
    if machines is None and "machine_rank" in values:
        needs = (
            f"{rank_variable}={environ[rank_variable]} ({source}) gives this pod's rank, but "
            f"no variable gives the number of pods: set {ENV_NNODES} in the manifest's env "
            f"(the pods of the job), or pass --num_machines N, the same on every pod."
        )
    return FromEnvironment(
        source, values, names, per_node=per_node, notices=tuple(notices),
        needs_machines=needs, topology=TOPOLOGY,
    )  # fmt: skip


def _machines(
    environ: Mapping[str, str],
    gpus: Callable[[], int],
    values: dict[str, Any],
    names: dict[str, str],
    notices: list[str],
) -> tuple[tuple[int | None, int] | None, int | None]:
    """Fill num_machines (a "MIN:MAX" range for an elastic run) and the name of what gives
    the processes; return the machines as (MIN or None, MAX) and the processes per machine
    (None where no variable tells them)."""
    per_raw = _set(environ, ENV_NPROC_PER_NODE)
    per_node = None if per_raw is None else processes_per_node(per_raw, ENV_NPROC_PER_NODE, gpus)
    world_raw = _set(environ, ENV_WORLD_SIZE) if _set(environ, ENV_RANK) else None
    world = None if world_raw is None else coerce("num_processes", world_raw, ENV_WORLD_SIZE)
    if world is not None and world < 1:
        raise ConfigError(f"{ENV_WORLD_SIZE}={world_raw!r}: expected 1 or more processes.")
    nnodes_raw = _set(environ, ENV_NNODES)
    if nnodes_raw is not None:
        low, high = machine_range(nnodes_raw, ENV_NNODES)
        values["num_machines"] = high if low is None or low == high else f"{low}:{high}"
        names["num_machines"] = ENV_NNODES
        if per_node is not None:
            names["num_processes"] = f"{ENV_NPROC_PER_NODE} x {ENV_NNODES}"
        # a PyTorchJob's WORLD_SIZE is pods x nprocPerNode (x 1 where that is not a number)
        expected = high * (int(per_raw) if per_raw and per_raw.isdigit() else 1)
        if world is not None and low in (None, high) and world != expected:
            notices.append(
                f"{ENV_WORLD_SIZE}={world} disagrees with {ENV_NNODES}={nnodes_raw}"
                + (f" x {ENV_NPROC_PER_NODE}={per_raw}" if per_raw else "")
                + f" = {expected} processes: the PET_ variables are used, as torchrun uses "
                f"them; fix the manifest so that the two agree"
            )
        return (low, high), per_node
    if world is None:
        if per_node is not None:
            names["num_processes"] = ENV_NPROC_PER_NODE
        return None, per_node
    per = per_node or 1  # a PyTorchJob without nprocPerNode: one process per pod
    if world % per:
        raise ConfigError(
            f"{ENV_WORLD_SIZE}={world} is not a multiple of {ENV_NPROC_PER_NODE}={per_raw} "
            f"(WORLD_SIZE counts the processes of all pods: pods x processes per pod). Set "
            f"{ENV_NNODES} to the number of pods, or make WORLD_SIZE a multiple of {per_raw}."
        )
    values["num_machines"] = world // per
    names["num_machines"] = (
        f"{ENV_WORLD_SIZE} / {ENV_NPROC_PER_NODE}" if per_raw else ENV_WORLD_SIZE
    )
    names["num_processes"] = ENV_WORLD_SIZE
    return (None, world // per), per


def _rank_variable(environ: Mapping[str, str]) -> str | None:
    """The variable that gives this pod's rank: PET_NODE_RANK; else a PyTorchJob's RANK (with
    WORLD_SIZE); else an indexed Job's JOB_COMPLETION_INDEX (with an address)."""
    if _set(environ, ENV_NODE_RANK):
        return ENV_NODE_RANK
    if _set(environ, ENV_RANK) and _set(environ, ENV_WORLD_SIZE):
        return ENV_RANK
    address = _set(environ, ENV_MASTER_ADDR) or _set(environ, ENV_PLAIN_MASTER_ADDR)
    if _set(environ, ENV_JOB_COMPLETION_INDEX) and address:
        return ENV_JOB_COMPLETION_INDEX
    return None


def _address(environ: Mapping[str, str], take: Callable[..., None], *, plain: bool) -> None:
    """main_process_ip and main_process_port: PET_RDZV_ENDPOINT, else PET_MASTER_ADDR and
    PET_MASTER_PORT, else (with `plain`: where a variable gave the machines or the rank)
    MASTER_ADDR and MASTER_PORT, which are also set for one process alone."""
    endpoint = _set(environ, ENV_RDZV_ENDPOINT)
    if endpoint is not None:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(
                f"{ENV_RDZV_ENDPOINT}={endpoint!r}: expected HOST:PORT, such as "
                f"job-worker-0:29400 (torchrun's --rdzv-endpoint)."
            )
        take("main_process_ip", host.strip("[]"), ENV_RDZV_ENDPOINT)
        take("main_process_port", port, ENV_RDZV_ENDPOINT)
        return
    pairs = [(ENV_MASTER_ADDR, ENV_MASTER_PORT)]
    pairs += [(ENV_PLAIN_MASTER_ADDR, ENV_PLAIN_MASTER_PORT)] if plain else []
    for addr, port in pairs:
        if _set(environ, addr) or _set(environ, port):
            if _set(environ, addr):
                take("main_process_ip", environ[addr].strip(), addr)
            if _set(environ, port):
                take("main_process_port", environ[port], port)
            return
