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
from accel_parallel.checkpoint import MARKER, STAGING, replaced_path


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

    Each process runs its staged writes into `dest`'s staging folder, publishes them (an
    upload, for a store) and then leaves its written flag with the checkpoint; the process
    that owns it waits for every one of its `ranks` (no collective: training goes on in the
    main thread) and then finalizes. Nothing is marked complete before every file is written,
    so a process killed meanwhile leaves the previous checkpoint the newest complete one.
    """

    WAIT_FOR_PEERS_S = 3600.0

    def __init__(
        self, jobs: list, dest: Any, meta: dict[str, Any], limit: int | None,
        *, writer: bool, rank: int, ranks: list[int], fsync: bool,
    ) -> None:  # fmt: skip
        self.dest = dest
        self.error: BaseException | None = None
        args = (jobs, dest, meta, limit, writer, rank, ranks, fsync)
        self.thread = threading.Thread(target=self._run, args=args, name="accel-async-save")
        self.thread.start()

    def _run(
        self, jobs: list, dest: Any, meta: dict[str, Any], limit: int | None,
        writer: bool, rank: int, ranks: list[int], fsync: bool,
    ) -> None:  # fmt: skip
        try:
            try:
                with deferred_fsync(enabled=fsync and dest.local):
                    run_parallel(jobs)
                dest.publish()
            except BaseException:
                with contextlib.suppress(Exception):  # the owner stops waiting for this one
                    dest.signal(rank, ok=False)
                raise
            dest.signal(rank)
            if not writer:
                return
            deadline = time.monotonic() + self.WAIT_FOR_PEERS_S
            while len(dest.written(ranks)) < len(ranks):
                failed = dest.written(ranks, ok=False)
                if failed:
                    raise RuntimeError(f"processes {failed} failed to write their files")
                if time.monotonic() > deadline:
                    missing = sorted(set(ranks) - set(dest.written(ranks)))
                    raise TimeoutError(f"processes {missing} never finished writing")
                time.sleep(0.02 if dest.local else 0.2)
            dest.clear_signals(ranks)
            dest.finalize(meta, limit, fsync)
        except BaseException as err:  # reported by wait_for_checkpoint
            self.error = err
        finally:
            dest.cleanup()

    def join(self) -> None:
        self.thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(
                f"the asynchronous save_state into {self.dest.name} failed ({self.error!r}); the "
                f"previous checkpoint is still the newest complete one."
            ) from self.error
