"""`accel launch --hang_timeout`: the launcher's side of the hang doctor.

Before the start, a note file is named in the launch configuration (`hang_report_note`);
a worker that diagnoses a hang writes its report folder there once every rank that could
has written its report. The launcher watches the note while the run goes on: when it is
written, it reads every rank's report (accel_state.hang, imported only then, so the launcher
does not import torch on its way in), prints one diagnosis naming the first divergence
between ranks, and empties the note for the next one (torchrun may restart the workers,
`--max_restarts`, and a restarted worker clears the old reports). While the run goes on, it
waits for the collecting rank (the one that waits for every report and probes the machines
of the ranks that wrote none) to mark the folder collected, so that its first diagnosis
already names a lost machine; when the run has ended it prints what is there. A note
written again for the same hang prints again only if the diagnosis changed. The launcher exits with
`HANG_EXIT_CODE` after a diagnosed hang, unless the restarted run finished (exit code 0).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

from accel_cli._launch_config import LaunchConfig

NOTE_KEY = "hang_report_note"
# The ranks of one machine each write the note as they stop, within their grace period of
# each other; a restarted worker (importing torch, meeting in a rendezvous) clears the old
# reports seconds later.
QUIET_SECONDS = 1.5


def with_hang_note(config: LaunchConfig) -> tuple[LaunchConfig, Path | None]:
    """`config` naming a fresh note file for the workers, and that file (None without
    --hang_timeout)."""
    if config.hang_timeout is None:
        return config, None
    fd, name = tempfile.mkstemp(prefix="accel-hang-", suffix=".note")
    os.close(fd)
    handed = {**config.handed_down, NOTE_KEY: name}
    return dataclasses.replace(config, handed_down=handed), Path(name)


class HangWatch:
    """Watch the note of one launch; print each diagnosis as it comes. Used as a context
    manager, it removes the note at the end, however the launch ends."""

    def __init__(self, note: Path | None, world_size: int) -> None:
        self.note, self.world_size = note, world_size
        self.diagnosed = 0
        self._last: tuple[str, str] | None = None  # (folder, diagnosis) last printed

    def __enter__(self) -> HangWatch:
        return self

    def __exit__(self, *_: object) -> None:
        if self.note is not None:
            self.note.unlink(missing_ok=True)

    def poll(self, *, final: bool = False) -> None:
        """Print the diagnosis of a hang the workers reported since the last poll, once the
        note has been quiet for QUIET_SECONDS (every rank of this machine writes it as it
        stops), or at once when the run has ended (`final`)."""
        if self.note is None:
            return
        self._forget_cleared_reports()
        try:
            folder = self.note.read_text().strip()
            quiet = time.time() - self.note.stat().st_mtime
        except OSError:
            return
        if not folder or (quiet < QUIET_SECONDS and not final):
            return
        from accel_state.hang import COLLECTED_FILE, DIAGNOSIS_FILE, brief, diagnose, load_reports

        if not final and not Path(folder, COLLECTED_FILE).exists():
            return  # the collecting rank is still waiting for reports or probing machines
        self.note.write_text("")

        reports = load_reports(folder, self.world_size)
        sizes = {int(r["world_size"]) for r in reports.values() if r is not None}
        if sizes and max(sizes) != self.world_size:
            reports = load_reports(folder, max(sizes))
        text = diagnose(reports)
        Path(folder, DIAGNOSIS_FILE).write_text(text + "\n")
        if self._last == (folder, text):
            return  # the same hang, its note written again after the probes
        print(f"\n{brief(text)}\n  reports: {folder}", file=sys.stderr, flush=True)
        self._last = (folder, text)
        self.diagnosed += 1

    def _forget_cleared_reports(self) -> None:
        """A restarted worker clears the reports of the last hang: a later note is a new hang
        even where its diagnosis reads the same."""
        if self._last is None:
            return
        from accel_state.hang import report_path

        folder = self._last[0]
        if not any(report_path(folder, r).exists() for r in range(self.world_size)):
            self._last = None

    def finish(self, code: int) -> int:
        """The launcher's exit code once the run ended with `code`."""
        if self.note is None:
            return code
        self.poll(final=True)
        if not self.diagnosed:
            return code
        from accel_state.hang import HANG_EXIT_CODE

        if code == 0:  # torchrun restarted the workers (--max_restarts) and the run finished
            print(
                "accel: the run recovered from the hang above (torchrun restarted its workers) "
                "and finished: exit code 0",
                file=sys.stderr,
            )
            return 0
        print(f"accel: exit code {HANG_EXIT_CODE} (a diagnosed hang)", file=sys.stderr)
        return HANG_EXIT_CODE
