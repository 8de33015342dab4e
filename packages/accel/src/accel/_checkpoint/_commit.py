"""Completing a checkpoint: the marker written last, the rename into place, the rotation; and
the background half of an asynchronous save, which completes it once every process wrote.

Nothing is marked complete before every file is written, so a crash at any moment leaves the
previous checkpoint the newest complete one.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from accel._checkpoint._naming import rotate
from accel_parallel import deferred_fsync, fsync_dir, fsync_file, run_parallel
from accel_parallel.checkpoint import MARKER, STAGING, replaced_path, written_flag


def finalize(tmp: Path, target: Path, meta: dict[str, Any], limit: int | None, fsync: bool) -> None:
    """On the writing process, once every file is written: the completion marker, then the
    rename into place (replacing an older folder of that name), then the total_limit."""
    with deferred_fsync(enabled=fsync):
        marker = tmp / MARKER
        meta = {**meta, "files": sorted(p.name for p in tmp.iterdir())}
        marker.write_text(json.dumps(meta, indent=1))
        fsync_file(marker)
        fsync_dir(tmp)
    trash = replaced_path(target)
    if target.exists():
        target.rename(trash)
    tmp.rename(target)
    fsync_dir(target.parent)
    if trash.exists():
        shutil.rmtree(trash)
    if tmp.parent.name == STAGING:  # leave the project folder as accelerate's: checkpoints/
        with contextlib.suppress(OSError):  # not empty: another save is being written
            tmp.parent.rmdir()
    rotate(target.parent, limit)


class AsyncSave:
    """The background half of an asynchronous save_state on one process.

    Each process runs its staged writes, then leaves its `written_flag` file in the folder;
    the process that owns the folder waits for every one of its `ranks` (no collective: training goes on in the
    main thread) and then finalizes. Nothing is marked complete before every file is written,
    so a process killed meanwhile leaves the previous checkpoint the newest complete one.
    """

    WAIT_FOR_PEERS_S = 3600.0

    def __init__(
        self, jobs: list, tmp: Path, target: Path, meta: dict[str, Any], limit: int | None,
        *, writer: bool, rank: int, ranks: list[int], fsync: bool,
    ) -> None:  # fmt: skip
        self.target = target
        self.error: BaseException | None = None
        args = (jobs, tmp, target, meta, limit, writer, rank, ranks, fsync)
        self.thread = threading.Thread(target=self._run, args=args, name="accel-async-save")
        self.thread.start()

    def _run(
        self, jobs: list, tmp: Path, target: Path, meta: dict[str, Any], limit: int | None,
        writer: bool, rank: int, ranks: list[int], fsync: bool,
    ) -> None:  # fmt: skip
        try:
            with deferred_fsync(enabled=fsync):
                run_parallel(jobs)
            (tmp / written_flag(rank)).write_text("")
            if not writer:
                return
            deadline = time.monotonic() + self.WAIT_FOR_PEERS_S
            flags = [tmp / written_flag(r) for r in ranks]
            while not all(f.exists() for f in flags):
                if time.monotonic() > deadline:
                    missing = [f.name for f in flags if not f.exists()]
                    raise TimeoutError(f"processes never finished writing: {missing}")
                time.sleep(0.02)
            for flag in flags:
                flag.unlink()
            finalize(tmp, target, meta, limit, fsync)
        except BaseException as err:  # reported by wait_for_checkpoint
            self.error = err

    def join(self) -> None:
        self.thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(
                f"the asynchronous save_state into {self.target} failed ({self.error!r}); the "
                f"previous checkpoint is still the newest complete one."
            ) from self.error
