"""The preflight's verdict: what the hosts that met on the main port disagree on, which ranks
are claimed twice or missing, each named with the host, the value and the fix.

Pure functions of the hosts' facts. A message names at most a few hosts, ranks or values
(SHOWN), then how many more: hosts are grouped by what they have in common and ranks
written as ranges, so that a verdict over thousands of machines stays a few lines long and
its size does not grow with the number of machines.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from accel_cli._launch_config import LaunchConfig
from accel_state.hosts import ranges as hosts_ranges

# How many hosts, ranks or values a message names before it says "and N more".
SHOWN = 4
# What the machines of one run must agree on for the rendezvous to form (fatal), and what
# they should agree on for the run to mean anything (a warning; an error with strict).
WORLD_KEYS = ("num_processes", "num_machines", "rdzv_backend")
TRAINING_KEYS = (
    "mixed_precision",
    "gradient_accumulation_steps",
    "distributed_type",
    "fsdp_config",
    "deepspeed_config",
    "parallelism_config",
    "fp8_config",
    "dynamo_config",
    "backend",
    "cpu",
    "accel",
    "torch",
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One finding: which host, what is wrong and what to do; fatal ends the launch."""

    host: str
    message: str
    fatal: bool = True

    def line(self) -> str:
        return f"{self.host}: {self.message}"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def host_facts(config: LaunchConfig, address: str, interface: str | None) -> dict[str, Any]:
    """What this host tells the others: who it is and what it would launch."""
    worker = config.to_worker_dict()
    training = {key: worker.get(key) for key in TRAINING_KEYS}
    training["accel"], training["torch"] = _version("accel-cli"), _version("torch")
    return {
        "machine_rank": config.machine_rank,
        "hostname": socket.gethostname(),
        "address": address,
        "interface": interface,
        "world": {
            "num_processes": config.num_processes,
            "num_machines": config.nnodes,
            "rdzv_backend": config.rdzv_backend,
        },
        "training": training,
    }


def host_label(facts: Mapping[str, Any]) -> str:
    return f"host {facts['machine_rank']} ({facts['hostname']}, {facts['address']})"


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def few(items: Sequence[str], total: int | None = None, most: int = SHOWN) -> str:
    """`items` joined by commas, the first `most` of them, then "and K more" (`total`: how
    many there are, where `items` holds only the first ones)."""
    total = len(items) if total is None else total
    shown = ", ".join(items[:most])
    return shown if total <= most else f"{shown} and {total - most} more"


def ranges(numbers: Sequence[int], most: int = 2 * SHOWN) -> str:
    """Machine ranks as runs ("0-5, 8, 9, 12-15"): accel_state.hosts's rule, 8 runs at most."""
    return hosts_ranges(numbers, most)


def verdict(
    hosts: Sequence[Mapping[str, Any]],
    config: LaunchConfig,
    *,
    strict: bool,
    complete: bool,
    ranked: bool,
) -> list[Problem]:
    """The problems of a set of arrived hosts (`ranked`: ranks are the static rendezvous's,
    each must be claimed once; `complete`: every expected host arrived)."""
    problems: list[Problem] = []
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for facts in hosts:
        by_rank.setdefault(int(facts["machine_rank"]), []).append(facts)
    if ranked:
        twice = [(rank, claims) for rank, claims in sorted(by_rank.items()) if len(claims) > 1]
        if len(twice) > SHOWN:
            problems.append(Problem(
                f"machine_rank {ranges([rank for rank, _ in twice[SHOWN:]])}",
                f"each claimed by several hosts too ({len(twice) - SHOWN} ranks besides those "
                f"named below): give each machine its own --machine_rank, 0 to "
                f"{config.num_machines - 1}.",
            ))  # fmt: skip
        for rank, claims in twice[:SHOWN]:
            if len({f["address"] for f in claims}) == 1:
                problems.append(Problem(
                    f"machine_rank {rank}",
                    f"claimed by {len(claims)} launches on one host ({claims[0]['address']}): "
                    f"two runs share main_process_port {config.main_process_port} on "
                    f"{config.main_process_ip}. Give each run its own --main_process_port.",
                ))  # fmt: skip
            else:
                where = few([f"{f['hostname']} at {f['address']}" for f in claims[: SHOWN + 1]],
                            len(claims))  # fmt: skip
                problems.append(
                    Problem(
                        f"machine_rank {rank}",
                        f"claimed by {len(claims)} hosts ({where}): give each machine its own "
                        f"--machine_rank, 0 to {config.num_machines - 1} (0 on the machine that "
                        f"holds --main_process_ip {config.main_process_ip}).",
                    )
                )
    if not complete:
        first = sorted(hosts, key=lambda f: int(f["machine_rank"]))[: SHOWN + 1]
        arrived = few([host_label(f) for f in first], len(hosts)) or "none"
        if ranked:
            missing = [r for r in range(config.num_machines) if r not in by_rank]
            what = f"machine_rank {ranges(missing)} never arrived"
        else:
            what = (
                f"{config.num_machines - len(hosts)} of {config.num_machines} hosts never arrived"
            )
        problems.append(
            Problem(
                "the run",
                f"{what} (arrived: {arrived}). Start `accel launch` on every machine with the same "
                f"--main_process_ip {config.main_process_ip} and --main_process_port "
                f"{config.main_process_port}; check that each reaches that address and port.",
            )
        )
    if not hosts:
        return problems
    reference = min(hosts, key=lambda f: int(f["machine_rank"]))
    for section, fatal in (("world", True), ("training", strict)):
        for key in sorted({k for f in hosts for k in f[section]}):
            values = [f[section].get(key) for f in hosts]
            if all(v == values[0] for v in values):
                continue
            problems.append(
                Problem(
                    "hosts disagree",
                    _side_by_side(key, hosts)
                    + ("" if fatal else " (a warning; `--preflight strict` makes it an error)")
                    + (
                        f"; the world must agree: launch every machine with {key} "
                        f"{_shown(reference[section].get(key))} as on {host_label(reference)}"
                        if fatal
                        else ""
                    ),
                    fatal=fatal,
                )
            )
    return problems


def _side_by_side(key: str, hosts: Sequence[Mapping[str, Any]]) -> str:
    """The values of `key` side by side, each with the hosts that have it (the first few of
    them and how many more), the first few values and how many more."""
    section = "world" if key in WORLD_KEYS else "training"
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for facts in hosts:
        groups.setdefault(_shown(facts[section].get(key)), []).append(facts)
    cells = [
        f"{few([host_label(f) for f in group[: SHOWN + 1]], len(group))} {key}={value}"
        for value, group in list(groups.items())[:SHOWN]
    ]
    if len(groups) > SHOWN:
        cells.append(f"{len(groups) - SHOWN} more values")
    return "  |  ".join(cells)
