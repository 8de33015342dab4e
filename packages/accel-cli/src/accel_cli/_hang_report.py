"""`accel launch --hang_timeout`: the launcher's side of the hang doctor.

Before the start, a note file is named in the launch configuration (`hang_report_note`);
a worker that diagnoses a hang writes its report folder there. When the run ends with a
note written, the launcher reads every rank's report (accel_state.hang, imported only then,
so the launcher does not import torch on its way in), prints one diagnosis naming the first
divergence between ranks, and exits with `HANG_EXIT_CODE`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from accel_cli._launch_config import LaunchConfig

NOTE_KEY = "hang_report_note"


def with_hang_note(config: LaunchConfig) -> tuple[LaunchConfig, Path | None]:
    """`config` naming a fresh note file for the workers, and that file (None without
    --hang_timeout)."""
    if config.hang_timeout is None:
        return config, None
    fd, name = tempfile.mkstemp(prefix="accel-hang-", suffix=".note")
    os.close(fd)
    handed = {**config.handed_down, NOTE_KEY: name}
    return dataclasses.replace(config, handed_down=handed), Path(name)


def report_hang(note: Path | None, code: int, world_size: int) -> int:
    """Print the diagnosis when a worker left a hang report; the launcher's exit code."""
    if note is None:
        return code
    try:
        folder = note.read_text().strip()
    finally:
        note.unlink(missing_ok=True)
    if not folder:
        return code
    from accel_state.hang import DIAGNOSIS_FILE, HANG_EXIT_CODE, diagnose, load_reports

    reports = load_reports(folder, world_size)
    sizes = {int(r["world_size"]) for r in reports.values() if r is not None}
    if sizes and max(sizes) != world_size:
        reports = load_reports(folder, max(sizes))
    text = diagnose(reports)
    Path(folder, DIAGNOSIS_FILE).write_text(text + "\n")
    print(f"\n{text}\n  reports: {folder}\n  exit code {HANG_EXIT_CODE}", file=sys.stderr)
    return HANG_EXIT_CODE
