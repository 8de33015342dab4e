"""Read the hang report folder and name the first divergence between ranks: pure functions
over the dumps, used by the ranks and by `accel launch` (imports neither torch nor accel).

A report folder holds, per rank k that could write one, `rank<k>.json`:

    rank, world_size    int
    reason              str: why this rank stopped (its own timeout, or another rank's notice)
    collectives         [entry]: the last collectives, oldest first; each has seq, op, shapes,
                        dtypes, file, line, state ("entered", "left", "failed"), error
    stack               [frame]: the main thread, outermost first; each has file, line,
                        function, module, user (outside accel, torch and the standard library)
    nccl_trace          str: the Flight Recorder file, or why there is none
    host                str: the address of the rank's machine (toward the main machine)
    hosts               {rank: address}: the machines of the ranks that wrote no report, as
                        the store told (the collecting rank's report only), and its own
    probes              {address: "answers" | "silent"}: those machines, each probed once on
                        the network (the collecting rank's report, when some were missing)

At thousands of ranks the diagnosis stays readable: its headline names ranks as ranges and
groups the ranks that are at the same place ("ranks 0-8183, 8192-16383 are in allreduce #57
(train.py:88)"), one line per rank follows in the file, and `brief` bounds what is printed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_state.hosts import ranges

REPORT_DIR_NAME = "hang_report"
DIAGNOSIS_FILE = "diagnosis.txt"
# Up to this many ranks a headline names each on its own; more are grouped by place.
_EACH = 4
# The rank lines `brief` keeps for the terminal (the file has them all).
BRIEF_LINES = 16
# What a rank outside accel's collectives is doing, told by the modules on its stack.
_ACTIVITIES = (
    (("torch.utils.data", "accel_data"), "the data loader"),
    (("torch.autograd",), "the backward pass"),
    (("torch.nn.parallel.distributed",), "DDP's forward"),
    (("torch.optim",), "the optimizer step"),
)

Report = Mapping[str, Any]


def report_path(folder: str | os.PathLike[str], rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


def stack_path(folder: str | os.PathLike[str], rank: int) -> Path:
    return Path(folder) / f"rank{rank}.stack.txt"


def load_reports(folder: str | os.PathLike[str], world_size: int) -> dict[int, Report | None]:
    """Each rank's report in `folder` (None for a rank that wrote none or a torn one)."""
    out: dict[int, Report | None] = {}
    for rank in range(world_size):
        try:
            out[rank] = json.loads(report_path(folder, rank).read_text())
        except (OSError, ValueError):
            out[rank] = None
    return out


def _site(entry: Mapping[str, Any]) -> str:
    return f"{os.path.basename(str(entry.get('file', '?')))}:{entry.get('line', 0)}"


def _label(entry: Mapping[str, Any]) -> str:
    return f"{entry['op']} #{entry['seq']} ({_site(entry)})"


def _open(report: Report) -> Mapping[str, Any] | None:
    """The collective the rank is in (entered, not left), or the one that failed last."""
    for entry in reversed(report.get("collectives", [])):
        if entry.get("state") in ("entered", "failed"):
            return entry
        return None
    return None


def _by_seq(report: Report) -> dict[int, Mapping[str, Any]]:
    return {int(e["seq"]): e for e in report.get("collectives", [])}


def where_in_stack(report: Report) -> str:
    """Where the rank's main thread is: "the data loader at data.py:40", or "train.py:12 (in
    step)", from the innermost frame of the user's code in its stack."""
    stack = report.get("stack", [])
    user = [f for f in stack if f.get("user")]
    frame = user[-1] if user else (stack[-1] if stack else None)
    if frame is None:
        return "an unknown place (no stack was recorded)"
    place = f"{os.path.basename(str(frame['file']))}:{frame['line']}"
    for modules, activity in _ACTIVITIES:
        if any(str(f.get("module", "")).startswith(modules) for f in stack):
            return f"{activity} at {place}"
    return f"{place} (in {frame.get('function', '?')})"


def _first_divergence(
    present: Mapping[int, Report],
) -> tuple[int, dict[int, Mapping[str, Any] | None]] | None:
    """The lowest sequence number where the ranks' records differ or one is still open,
    with each rank's entry there (None: not reached)."""
    rings = {rank: _by_seq(r) for rank, r in present.items()}
    known = [seq for ring in rings.values() for seq in ring]
    if not known:
        return None
    start = max(min(ring) for ring in rings.values() if ring) if any(rings.values()) else 0
    last = {rank: max(ring) if ring else 0 for rank, ring in rings.items()}
    for seq in range(start, max(known) + 1):
        at = {rank: (ring.get(seq) if seq <= last[rank] else None) for rank, ring in rings.items()}
        ops = {e["op"] for e in at.values() if e is not None}
        unreached = any(e is None for e in at.values())
        stuck = any(e is not None and e.get("state") != "left" for e in at.values())
        if len(ops) > 1 or unreached or stuck:
            return seq, at
    return None


def rank_list(ranks: list[int] | set[int], most: int = 8) -> str:
    """ "rank 5", "ranks 2, 3", "ranks 0-8183, 8192-16383": `hosts.ranges` with its noun."""
    return f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {ranges(ranks, most)}"


def _grouped(places: Mapping[int, str]) -> str:
    """ "rank 0 is in X; rank 1 is in Y" for a few ranks; for more, the ranks at each place
    together: "ranks 0-5, 8 are in X; rank 6 is in Y" (`places`: rank -> "is in X")."""
    if len(places) <= _EACH:
        return "; ".join(f"rank {rank} {place}" for rank, place in sorted(places.items()))
    groups: dict[str, list[int]] = {}
    for rank, place in sorted(places.items()):
        groups.setdefault(place, []).append(rank)
    order = sorted(groups.items(), key=lambda item: item[1][0])
    parts = []
    for place, ranks in order[:_EACH]:
        verb = place if len(ranks) == 1 else _plural(place)
        parts.append(f"{rank_list(ranks)} {verb}")
    if len(order) > _EACH:
        rest = sum(len(ranks) for _, ranks in order[_EACH:])
        parts.append(f"{rest} more ranks are elsewhere (see each rank's line)")
    return "; ".join(parts)


def _plural(place: str) -> str:
    for one, many in (("is ", "are "), ("passed ", "passed "), ("failed ", "failed ")):
        if place.startswith(one):
            return many + place[len(one) :]
    return place


def _verb(entry: Mapping[str, Any]) -> str:
    return {"entered": "is in", "failed": "failed in"}.get(str(entry.get("state")), "passed")


def diagnose(reports: Mapping[int, Report | None]) -> str:
    """One paragraph naming the first divergence between the ranks, then one line per rank.

    "rank 1 is in gather #57 (train.py:88) while rank 0 is in reduce #57 (train.py:91)",
    "rank 1 never reached collective #57: it is in the data loader at data.py:40", or
    "rank 1 wrote no report (the process died or was killed) while rank 0 ...".
    """
    present = {rank: r for rank, r in reports.items() if r is not None}
    missing = sorted(rank for rank, r in reports.items() if r is None)
    headline = _headline(present, missing)
    lines = [f"accel hang doctor: {headline}"]
    for rank in sorted(reports):
        lines.append("  " + _rank_line(rank, reports[rank]))
    return "\n".join(lines)


def _headline(present: Mapping[int, Report], missing: list[int]) -> str:
    found = _first_divergence(present)
    if missing:
        places = {}
        for rank, report in present.items():
            entry = _open(report)
            where = _label(entry) if entry else where_in_stack(report)
            places[rank] = f"{_verb(entry) if entry else 'is at'} {where}"
        tail = f" while {_grouped(places)}" if places else ""
        lost = _lost_hosts(present, missing)
        if lost is not None:
            return f"{lost}{tail}"
        return f"{rank_list(missing)} wrote no report (the process died or was killed){tail}"
    if found is None:
        places = {rank: where_in_stack(r) for rank, r in sorted(present.items())}
        loading = [rank for rank, place in places.items() if place.startswith("the data loader")]
        if loading and len(loading) < len(places):
            odd = loading[0]
            others = _grouped({r: f"is in {p}" for r, p in places.items() if r != odd})
            return (
                f"rank {odd} never reached the next collective: it is in {places[odd]} ({others})"
            )
        listing = _grouped({r: f"is in {p}" for r, p in places.items()})
        return f"no accel collective is pending and a step exceeded the timeout: {listing}"
    seq, at = found
    reached = {rank: e for rank, e in at.items() if e is not None}
    groups: dict[str, list[int]] = {}
    for rank, entry in sorted(reached.items()):
        groups.setdefault(entry["op"], []).append(rank)
    if len(groups) > 1:
        # the op most ranks called is the reference; the first rank of another op diverges
        ref_op = max(groups, key=lambda op: (len(groups[op]), -groups[op][0]))
        odd = min(rank for op, ranks in groups.items() if op != ref_op for rank in ranks)
        ref = groups[ref_op][0]
        return (
            f"rank {odd} {_verb(reached[odd])} {_label(reached[odd])} while rank {ref} "
            f"{_verb(reached[ref])} {_label(reached[ref])}"
        )
    unreached = sorted(rank for rank, e in at.items() if e is None)
    if unreached:
        odd = unreached[0]
        ref = min(reached)
        return (
            f"rank {odd} never reached collective #{seq}: it is in "
            f"{where_in_stack(present[odd])} (rank {ref} {_verb(reached[ref])} "
            f"{_label(reached[ref])})"
        )
    entry = reached[min(reached)]
    return (
        f"{rank_list(set(reached))} are all in {_label(entry)}: no rank diverged; a peer is "
        f"slow or stuck"
    )


def _lost_hosts(present: Mapping[int, Report], missing: list[int]) -> str | None:
    """The machines none of whose ranks wrote a report, with what the probes of the ranks
    that did found ("silent": its link or the machine is down); None when every silent rank
    shares a machine with a rank that reported (a process, not a machine, is gone)."""
    hosts: dict[int, str] = {}
    probes: dict[str, str] = {}
    for report in present.values():
        hosts.update({int(rank): str(addr) for rank, addr in report.get("hosts", {}).items()})
        probes.update(report.get("probes", {}))
    reporting = {str(report.get("host")) for report in present.values()}
    by_host: dict[str, list[int]] = {}
    for rank in missing:
        addr = hosts.get(rank)
        if addr is None or addr in reporting:
            return None
        by_host.setdefault(addr, []).append(rank)
    parts = []
    for addr, ranks in list(by_host.items())[:_EACH]:
        who = f"host {addr} ({rank_list(ranks)})"
        state = probes.get(addr)
        if state == "silent":
            parts.append(
                f"{who} is lost: it does not answer on the network (its link or the machine is down)"
            )
        elif state == "answers":
            parts.append(
                f"{who} answers on the network, but its processes wrote no report (they died or were killed)"
            )
        else:
            parts.append(
                f"{who} wrote no report (the machine, its link or its processes went down)"
            )
    if len(by_host) > _EACH:
        more = list(by_host.items())[_EACH:]
        ranks = sum(len(r) for _, r in more)
        parts.append(f"{len(more)} more hosts ({ranks} ranks) wrote no report either")
    return "; ".join(parts)


def brief(text: str, lines: int = BRIEF_LINES) -> str:
    """A diagnosis as printed: its headline and `lines` rank lines (those of ranks that wrote
    no report first, up to half of them; then the first others), then how many more the
    file holds."""
    head, *ranks = text.splitlines()
    if len(ranks) <= lines:
        return text
    silent = [i for i, line in enumerate(ranks) if line.endswith(": no report")][: lines // 2]
    chosen = set(silent)
    chosen.update([i for i in range(len(ranks)) if i not in chosen][: lines - len(chosen)])
    kept = [ranks[i] for i in sorted(chosen)]
    more = f"  ... {len(ranks) - len(kept)} more ranks: see {DIAGNOSIS_FILE}"
    return "\n".join([head, *kept, more])


def _rank_line(rank: int, report: Report | None) -> str:
    if report is None:
        return f"rank {rank}: no report"
    entry = _open(report)
    place = f"{_verb(entry)} {_label(entry)}" if entry else "in no collective"
    reason = str(report.get("reason", ""))
    error = entry.get("error") if entry else None
    error = f"; {error}" if error and error not in reason else ""
    return f"rank {rank}: {place}; stack at {where_in_stack(report)}; {reason}{error}"
