"""What `accel launch` takes from a SLURM allocation: machines, this machine's rank, the
address of machine 0.

Inside a job (`SLURM_JOB_ID` set) with its node count known, `accel launch` started once per
node (``srun --ntasks-per-node=1 accel launch ...``) needs no per-node flags:

    num_machines     SLURM_JOB_NUM_NODES (or SLURM_NNODES)
    machine_rank     SLURM_NODEID
    main_process_ip  the first host of SLURM_JOB_NODELIST (or SLURM_NODELIST), expanded by
                     `scontrol show hostnames` when it is on PATH, else by `expand_hostlist`

A flag beats these and these beat the config file; with --num_machines given, none is
taken (the flags describe the topology). On one node nothing is taken: the run rendezvouses
on loopback as usual.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping

from accel_cli._config import ConfigError

ENV_SLURM_JOB_ID = "SLURM_JOB_ID"
ENV_SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"
ENV_SLURM_NNODES = "SLURM_NNODES"
ENV_SLURM_NODEID = "SLURM_NODEID"
ENV_SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
ENV_SLURM_NODELIST = "SLURM_NODELIST"

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


def slurm_launch_values(
    environ: Mapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> dict[str, object]:
    """num_machines, machine_rank and main_process_ip from a SLURM allocation of several
    nodes ({} outside one, or on one node)."""
    if ENV_SLURM_JOB_ID not in environ:
        return {}
    nodes_raw = environ.get(ENV_SLURM_JOB_NUM_NODES) or environ.get(ENV_SLURM_NNODES)
    if not nodes_raw:
        return {}
    try:
        nodes = int(nodes_raw)
        rank = int(environ.get(ENV_SLURM_NODEID, "0"))
    except ValueError:
        raise ConfigError(
            f"SLURM variables {ENV_SLURM_JOB_NUM_NODES}/{ENV_SLURM_NNODES}={nodes_raw!r} and "
            f"{ENV_SLURM_NODEID}={environ.get(ENV_SLURM_NODEID)!r} must be integers; pass "
            f"--num_machines and --machine_rank instead."
        ) from None
    if nodes <= 1:
        return {}
    hostlist = environ.get(ENV_SLURM_JOB_NODELIST) or environ.get(ENV_SLURM_NODELIST)
    values: dict[str, object] = {"num_machines": nodes, "machine_rank": rank}
    if hostlist:
        try:
            values["main_process_ip"] = first_host(hostlist, which, run)
        except ValueError as err:
            raise ConfigError(f"{err}; pass --main_process_ip (the address of node 0).") from None
    return values
