"""The launcher's side of the hang doctor (accel_cli._hang_report.HangWatch) over reports
written by the doctor itself: one printed diagnosis per hang, however often a rank writes
its note (a rank writes it again after probing the machines of silent ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_cli._hang_report import HangWatch
from accel_state.hang import COLLECTED_FILE, HANG_EXIT_CODE, HangDoctor, report_path


def _report(folder: Path, rank: int, reason: str) -> None:
    doctor = HangDoctor(30, rank=rank, world_size=2, folder=folder, exit_process=False)
    doctor.write_report(reason)  # not started: no watchdog, no signal handler


def _first_diagnosis(tmp_path: Path) -> tuple[HangWatch, Path, Path]:
    """A watch that printed rank 0's report of a hang (rank 1 wrote none): it, the report
    folder and the note."""
    folder, note = tmp_path / "hang_report", tmp_path / "note"
    folder.mkdir()
    watch = HangWatch(note, world_size=2)
    _report(folder, 0, "rank 0: a step took more than 30s")
    note.write_text(str(folder))
    watch.poll(final=True)
    return watch, folder, note


def test_a_note_written_again_for_the_same_hang_is_printed_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watch, folder, note = _first_diagnosis(tmp_path)
    first = capsys.readouterr().err
    assert "accel hang doctor: rank 1 wrote no report" in first, first

    note.write_text(str(folder))  # again, after rank 0 probed rank 1's machine
    watch.poll(final=True)
    assert "accel hang doctor" not in capsys.readouterr().err
    assert watch.diagnosed == 1

    for rank in range(2):  # a restarted worker clears the reports of the last hang
        report_path(folder, rank).unlink(missing_ok=True)
    watch.poll()
    _report(folder, 0, "rank 0: a step took more than 30s")  # and the same hang again
    note.write_text(str(folder))
    assert watch.finish(1) == HANG_EXIT_CODE
    assert "accel hang doctor: rank 1 wrote no report" in capsys.readouterr().err
    assert watch.diagnosed == 2


def test_a_diagnosis_that_changed_is_printed_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watch, folder, note = _first_diagnosis(tmp_path)
    _report(folder, 1, "stopped by rank 0")  # rank 1's report came after all
    note.write_text(str(folder))
    watch.poll(final=True)
    err = capsys.readouterr().err
    assert err.count("accel hang doctor:") == 2, err
    assert watch.diagnosed == 2


def test_a_running_launch_waits_for_the_collecting_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-run, a note alone prints nothing until the collecting rank marked the folder
    collected (its probes done): the first diagnosis printed is the collector's."""
    import accel_cli._hang_report as hang_report

    monkeypatch.setattr(hang_report, "QUIET_SECONDS", 0.0)
    folder, note = tmp_path / "hang_report", tmp_path / "note"
    folder.mkdir()
    watch = HangWatch(note, world_size=2)
    _report(folder, 0, "rank 0: a step took more than 30s")
    note.write_text(str(folder))
    watch.poll()
    assert "accel hang doctor" not in capsys.readouterr().err
    assert watch.diagnosed == 0 and note.read_text() == str(folder)
    (folder / COLLECTED_FILE).write_text("0")
    watch.poll()
    assert "accel hang doctor: rank 1 wrote no report" in capsys.readouterr().err
    assert watch.diagnosed == 1


def test_the_launch_removes_its_note_when_it_ends_in_an_error(tmp_path, monkeypatch):
    import tempfile

    from accel_cli._commands import launch
    from accel_cli.main import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkstemp puts the note
    script = tmp_path / "train.py"
    script.write_text("")
    handed: list[str] = []

    def interrupted(cmd, env, **_):
        handed.append(env["ACCEL_LAUNCH_CONFIG"])
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "run_child", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["launch", "--cpu", "--hang_timeout", "30", str(script)])
    assert handed and "hang_report_note" in handed[0]  # the note was made for this launch
    assert not list(tmp_path.glob("accel-hang-*.note"))
