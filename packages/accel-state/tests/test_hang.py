"""The hang doctor of accel-state: the ring numbers collectives and records where they were
called; `diagnose` names the first divergence; and two real gloo processes (no launcher)
end a hang with rank 0's diagnosis and HANG_EXIT_CODE within about twice the timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from accel_state import hang
from accel_state._diagnosis import BRIEF_LINES
from accel_state.hang import HANG_EXIT_CODE, CollectiveRing, HangDoctor, brief, diagnose

pytestmark = pytest.mark.serial  # timeouts: runs alone under pytest -n (conftest.py)

WORKER = Path(__file__).with_name("_hang_worker.py")
RanksRunner = Callable[..., list[subprocess.CompletedProcess]]  # conftest.py's run_ranks
GUARD = 60  # seconds: torch import in both ranks, a 2 s timeout, the grace for reports


def test_public_names() -> None:
    assert hang.__all__ == [
        "COLLECTED_FILE", "DIAGNOSIS_FILE", "HANG_EXIT_CODE", "REPORT_DIR_NAME", "CollectiveRecord",
        "CollectiveRing", "HangDoctor", "active_doctor", "brief", "diagnose", "load_reports",
        "process_group_store", "report_path", "where_in_stack",
    ]  # fmt: skip


def test_ring_numbers_collectives_and_records_the_callers_line() -> None:
    ring = CollectiveRing(size=2)
    first = ring.enter("gather", {"a": torch.zeros(2, 3), "b": [torch.ones(4, dtype=torch.int64)]})
    line = sys._getframe().f_lineno - 1
    ring.leave(first)
    ring.run("reduce", torch.zeros(1), lambda: None)
    third = ring.enter("barrier")
    assert [e["seq"] for e in ring.to_list()] == [2, 3]  # the last `size` entries
    assert first.shapes == [[2, 3], [4]] and first.dtypes == ["float32", "int64"]
    assert first.site == f"test_hang.py:{line}" and first.state == "left"
    assert ring.current is third and third.state == "entered"


def test_ring_marks_a_failed_collective_and_reports_distributed_errors() -> None:
    ring, seen = CollectiveRing(), []
    ring.on_error = lambda record, err: seen.append(record.seq)

    def broken() -> None:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer")

    with pytest.raises(RuntimeError, match="closed by peer"):
        ring.run("gather", None, broken)
    with pytest.raises(ValueError):  # not a distributed error: raised as it is, not reported
        ring.run("gather", None, lambda: int("x"))
    assert seen == [1]
    assert [e["state"] for e in ring.to_list()] == ["failed", "failed"]


def _entry(seq: int, op: str, line: int, state: str = "left") -> dict:
    return {"seq": seq, "op": op, "file": "/x/train.py", "line": line, "state": state}


def _frame(file: str, line: int, module: str, user: bool) -> dict:
    return {"file": file, "line": line, "function": "f", "module": module, "user": user}


def test_diagnose_names_different_collectives_at_the_same_number() -> None:
    reports = {
        0: {"collectives": [_entry(56, "gather", 80), _entry(57, "reduce", 91, "entered")]},
        1: {"collectives": [_entry(56, "gather", 80), _entry(57, "gather", 88, "entered")]},
    }
    text = diagnose(reports)
    assert text.splitlines()[0] == (
        "accel hang doctor: rank 1 is in gather #57 (train.py:88) while rank 0 is in reduce "
        "#57 (train.py:91)"
    )


def test_diagnose_names_the_rank_that_never_reached_a_collective_and_where_it_is() -> None:
    stack = [
        _frame("/x/train.py", 20, "__main__", True),
        _frame("/t/dataloader.py", 700, "torch.utils.data.dataloader", False),
        _frame("/x/data.py", 40, "data", True),
    ]
    reports = {
        0: {"collectives": [_entry(56, "gather", 80), _entry(57, "reduce", 91, "entered")]},
        1: {"collectives": [_entry(56, "gather", 80)], "stack": stack},
    }
    assert diagnose(reports).splitlines()[0] == (
        "accel hang doctor: rank 1 never reached collective #57: it is in the data loader at "
        "data.py:40 (rank 0 is in reduce #57 (train.py:91))"
    )


def test_diagnose_names_a_rank_that_left_no_report() -> None:
    reports = {0: {"collectives": [_entry(3, "gather", 9, "failed")]}, 1: None}
    assert diagnose(reports).splitlines()[0] == (
        "accel hang doctor: rank 1 wrote no report (the process died or was killed) while "
        "rank 0 failed in gather #3 (train.py:9)"
    )


def test_diagnose_names_a_lost_machine_by_what_the_probes_found() -> None:
    """Ranks 2 and 3 share a machine that wrote nothing: a machine, not a process, is gone;
    the survivors' probe tells a cut link (silent) from killed processes (answers)."""
    hosts = {"0": "10.0.0.1", "1": "10.0.0.1", "2": "10.0.0.2", "3": "10.0.0.2"}
    entry = [_entry(3, "gather", 9, "entered")]
    for state, words in (
        ("silent", "is lost: it does not answer on the network (its link or the machine is down)"),
        ("answers", "answers on the network, but its processes wrote no report"),
        (None, "wrote no report (the machine, its link or its processes went down)"),
    ):
        probes = {} if state is None else {"10.0.0.2": state}
        report = {"collectives": entry, "host": "10.0.0.1", "hosts": hosts, "probes": probes}
        text = diagnose({0: report, 1: report, 2: None, 3: None}).splitlines()[0]
        assert text.startswith(f"accel hang doctor: host 10.0.0.2 (ranks 2, 3) {words}"), text
        assert text.endswith("while rank 0 is in gather #3 (train.py:9); rank 1 is in gather #3 "
                             "(train.py:9)"), text  # fmt: skip
    # a silent rank on a machine that reported is a process gone, as before
    report = {"collectives": entry, "host": "10.0.0.1", "hosts": hosts}
    text = diagnose({0: report, 1: None, 2: report, 3: report}).splitlines()[0]
    assert "rank 1 wrote no report (the process died or was killed)" in text


def test_a_step_past_the_timeout_is_reported_without_ending_the_process(
    tmp_path: Path, run_ranks: RanksRunner
) -> None:
    doctor = HangDoctor(0.3, rank=0, world_size=1, folder=tmp_path, exit_process=False).start()
    try:
        deadline = time.monotonic() + 10
        while doctor.diagnosis is None and time.monotonic() < deadline:
            time.sleep(0.05)  # no beat: the step runs past the timeout
    finally:
        doctor.stop()
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert "a step took more than 0.3s" in report["reason"]
    assert report["stack"][-1]["function"].startswith("test_a_step_past")
    assert "no accel collective is pending" in doctor.diagnosis
    assert "test_hang.py" in (tmp_path / "rank0.stack.txt").read_text()
    assert hang.active_doctor() is None


def _site(name: str) -> str:
    """`_hang_worker.py:<line>` of the line marked `# site: <name>`."""
    for number, line in enumerate(WORKER.read_text().splitlines(), start=1):
        if line.endswith(f"# site: {name}"):
            return f"{WORKER.name}:{number}"
    raise AssertionError(f"no line marked {name!r} in {WORKER}")


def _run_scenario(
    run_ranks: RanksRunner, scenario: str, folder: Path
) -> list[subprocess.CompletedProcess]:
    return run_ranks([sys.executable, str(WORKER), scenario, str(folder)], timeout=GUARD)


def test_two_ranks_calling_different_collectives_end_with_rank_0s_diagnosis(
    tmp_path: Path,
    run_ranks: RanksRunner,
) -> None:
    rank0, rank1 = _run_scenario(run_ranks, "different", tmp_path)
    assert (rank0.returncode, rank1.returncode) == (HANG_EXIT_CODE, HANG_EXIT_CODE)
    assert (
        f"accel hang doctor: rank 1 is in gather #3 ({_site('different gather')}) while rank 0 "
        f"is in reduce #3 ({_site('reduce')})" in rank0.stderr
    ), rank0.stderr
    assert "accel hang doctor" not in rank1.stderr  # one diagnosis, by rank 0


def test_a_killed_rank_is_named_by_the_survivor(tmp_path: Path, run_ranks: RanksRunner) -> None:
    rank0, rank1 = _run_scenario(run_ranks, "killed", tmp_path)
    assert rank0.returncode == HANG_EXIT_CODE and rank1.returncode == -9
    assert (
        "accel hang doctor: rank 1 wrote no report (the process died or was killed) while "
        f"rank 0 failed in gather #3 ({_site('gather')})" in rank0.stderr
    ), rank0.stderr


def test_a_sigterm_during_a_collective_waits_for_its_failure_to_be_reported(
    tmp_path: Path,
    run_ranks: RanksRunner,
) -> None:
    """A launcher SIGTERMs the survivors once one worker died, often before their collective
    failed on the lost peer: the doctor holds the signal until then, so the survivor still
    reports what it was waiting for."""
    rank0, rank1 = _run_scenario(run_ranks, "stopped", tmp_path)
    assert rank0.returncode == HANG_EXIT_CODE and rank1.returncode == -9, rank0.stderr
    assert (
        "accel hang doctor: rank 1 wrote no report (the process died or was killed) while "
        f"rank 0 failed in gather #3 ({_site('gather')})" in rank0.stderr
    ), rank0.stderr


def test_a_sigterm_between_collectives_ends_the_rank_at_once(
    tmp_path: Path, run_ranks: RanksRunner
) -> None:
    rank0, rank1 = _run_scenario(run_ranks, "terminated", tmp_path)
    assert rank0.returncode == -15, rank0.stderr
    assert rank1.returncode == HANG_EXIT_CODE, rank1.stderr
    assert "rank 0 wrote no report" in rank1.stderr, rank1.stderr


def test_the_doctor_holds_sigterm_only_while_it_watches(tmp_path: Path) -> None:
    import signal

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    doctor = HangDoctor(30, rank=0, world_size=1, folder=tmp_path, exit_process=False)
    try:
        doctor.start()
        assert getattr(signal.getsignal(signal.SIGTERM), "stands_for_default", False)
    finally:
        doctor.stop()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_diagnosis_at_thousands_of_ranks_groups_them_and_prints_a_bounded_brief() -> None:
    """16,384 ranks, the 8 of one machine lost: the headline names the machine's ranks and
    the others as ranges; the file has a line per rank, the printed brief 16."""
    entry = [_entry(57, "allreduce", 88, "entered")]
    hosts = {str(r): "10.0.4.7" for r in range(8184, 8192)}
    collector = {"collectives": entry, "host": "10.0.0.1", "hosts": hosts,
                 "probes": {"10.0.4.7": "silent"}}  # fmt: skip
    other = {"collectives": entry, "host": "10.0.0.2"}
    reports = {r: None if r in range(8184, 8192) else other for r in range(16384)}
    reports[0] = collector
    text = diagnose(reports)
    assert text.splitlines()[0] == (
        "accel hang doctor: host 10.0.4.7 (ranks 8184-8191) is lost: it does not answer on the "
        "network (its link or the machine is down) while ranks 0-8183, 8192-16383 are in "
        "allreduce #57 (train.py:88)"
    )
    assert len(text.splitlines()) == 16385
    shown = brief(text).splitlines()
    assert len(shown) == 1 + BRIEF_LINES + 1 and shown[-1].endswith(
        "16368 more ranks: see diagnosis.txt"
    )
    assert shown[9:17] == [f"  rank {r}: no report" for r in range(8184, 8192)]
