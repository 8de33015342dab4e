"""What `accel launch` takes from a SLURM allocation: machines, this machine's rank, the
address of machine 0.

Inside an srun step (`SLURM_JOB_ID` set, a step id of srun's own) that spans several nodes,
`accel launch` started once per node (``srun --ntasks-per-node=1 accel launch ...``) needs
no per-node flags:

    num_machines     SLURM_STEP_NUM_NODES (else SLURM_NNODES, else SLURM_JOB_NUM_NODES)
    machine_rank     SLURM_NODEID (the node's index among the step's nodes)
    main_process_ip  the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, else
                     SLURM_NODELIST), expanded by `scontrol show hostnames` when it is on
                     PATH, else by `expand_hostlist`

The step's values, not the job's: `srun -N1 accel launch` inside a job of two nodes is one
machine. A flag beats these and these beat the config file; with --num_machines given, none
is taken (the flags describe the topology). On one node nothing is taken: the run
rendezvouses on loopback as usual. Nor in the batch script itself or salloc's shell (no
step id, or one of SLURM's reserved ids): one launcher runs there, on the first node, so
it is one machine whatever the job's node count.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping

from accel_cli._config import ConfigError

ENV_SLURM_JOB_ID = "SLURM_JOB_ID"
ENV_SLURM_STEP_ID = "SLURM_STEP_ID"
ENV_SLURM_STEPID = "SLURM_STEPID"
ENV_SLURM_STEP_NUM_NODES = "SLURM_STEP_NUM_NODES"
ENV_SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"
ENV_SLURM_NNODES = "SLURM_NNODES"
ENV_SLURM_NODEID = "SLURM_NODEID"
ENV_SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
ENV_SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
ENV_SLURM_NODELIST = "SLURM_NODELIST"
# srun's steps count up from 0; the ids above this one are SLURM's reserved steps (batch
# script, extern, salloc's interactive shell). Same rule as accel_state's detect_launch.
SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0

# One host expression: a prefix, then optionally [ranges], then maybe more (nested forms
# like a[1-2]b[3-4] multiply out).
_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top_level(text: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in the SLURM host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in the SLURM host list {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(ranges: str, where: str) -> list[str]:
    """'001-003,7' -> ['001', '002', '003', '7'] (zero padding kept)."""
    out = []
    for item in ranges.split(","):
        lo, dash, hi = item.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"cannot read the range {item!r} in the SLURM host list {where!r}")
        if not dash:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"the range {item!r} runs backwards in the SLURM host list {where!r}")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compact host list as host names: ``gpu[01-02,05],login`` -> gpu01, gpu02,
    gpu05, login. Raises ValueError naming the part it cannot read."""
    hosts: list[str] = []
    for expr in _split_top_level(hostlist):
        names = [""]
        pos = 0
        for match in _BRACKET.finditer(expr):
            literal = expr[pos : match.start()]
            values = _expand_ranges(match.group(1), hostlist)
            names = [f"{n}{literal}{v}" for n in names for v in values]
            pos = match.end()
        hosts.extend(f"{n}{expr[pos:]}" for n in names)
    if not hosts:
        raise ValueError(f"the SLURM host list {hostlist!r} names no host")
    return hosts


def first_host(
    hostlist: str,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> str:
    """The first host of a SLURM host list: `scontrol show hostnames` when available (it
    knows every form SLURM writes), else `expand_hostlist`."""
    scontrol = which("scontrol")
    if scontrol:
        try:
            done = run(
                [scontrol, "show", "hostnames", hostlist],
                capture_output=True,
                text=True,
                timeout=30,
            )
            names = done.stdout.split()
            if done.returncode == 0 and names:
                return names[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return expand_hostlist(hostlist)[0]


def in_srun_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of an srun step, not the batch script or salloc's
    shell (which have no step id, or a reserved one)."""
    raw = environ.get(ENV_SLURM_STEP_ID) or environ.get(ENV_SLURM_STEPID)
    try:
        return raw is not None and 0 <= int(raw) < SLURM_MAX_NORMAL_STEP_ID
    except ValueError:
        raise ConfigError(
            f"SLURM's step id {ENV_SLURM_STEP_ID}={raw!r} is not an integer; pass "
            f"--num_machines and --machine_rank instead."
        ) from None


def _first_set(environ: Mapping[str, str], *names: str) -> tuple[str, str | None]:
    """(name, value) of the first variable set and not empty; (names[0], None) if none is."""
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return names[0], None


# The main port of a multi-node srun step whose port no flag or file gives: one per job and
# step, so that two runs sharing nodes (jobs with OverSubscribe, two steps of one job) do not
# meet on 29500. Below Linux's ephemeral range (32768 and up), which clients take from.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 10000


def slurm_default_port(environ: Mapping[str, str]) -> int | None:
    """The main port for a launch in an srun step over several nodes (None elsewhere)."""
    if not slurm_launch_values(environ, which=lambda _: None):
        return None
    try:
        job = int(environ[ENV_SLURM_JOB_ID])
        step = int(environ.get(ENV_SLURM_STEP_ID) or environ.get(ENV_SLURM_STEPID) or 0)
    except ValueError:
        return None
    return SLURM_PORT_BASE + (job * 31 + step) % SLURM_PORT_SPAN


def slurm_launch_values(
    environ: Mapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> dict[str, object]:
    """num_machines, machine_rank and main_process_ip from an srun step over several nodes
    ({} outside one, on one node, or in the batch script)."""
    if ENV_SLURM_JOB_ID not in environ or not in_srun_step(environ):
        return {}
    nodes_name, nodes_raw = _first_set(
        environ, ENV_SLURM_STEP_NUM_NODES, ENV_SLURM_NNODES, ENV_SLURM_JOB_NUM_NODES
    )
    if not nodes_raw:
        return {}
    try:
        nodes = int(nodes_raw)
        rank = int(environ.get(ENV_SLURM_NODEID, "0"))
    except ValueError:
        raise ConfigError(
            f"SLURM variables {nodes_name}={nodes_raw!r} and "
            f"{ENV_SLURM_NODEID}={environ.get(ENV_SLURM_NODEID)!r} must be integers; pass "
            f"--num_machines and --machine_rank instead."
        ) from None
    if nodes <= 1:
        return {}
    _, hostlist = _first_set(
        environ, ENV_SLURM_STEP_NODELIST, ENV_SLURM_JOB_NODELIST, ENV_SLURM_NODELIST
    )
    values: dict[str, object] = {"num_machines": nodes, "machine_rank": rank}
    if hostlist:
        try:
            values["main_process_ip"] = first_host(hostlist, which, run)
        except ValueError as err:
            raise ConfigError(f"{err}; pass --main_process_ip (the address of node 0).") from None
    return values
