"""Durable writes: fsync of files and folders, torch.save that is fsynced, and deferral.

Inside `deferred_fsync()`, `fsync_file` hands the fsync to background threads and returns at
once, so a file's flush to disk overlaps the writing of the next one; leaving the block waits
for every fsync (and raises the first error), so durability is unchanged for the caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

_DEFERRED: contextvars.ContextVar[tuple[ThreadPoolExecutor, list[Future]] | bool | None] = (
    contextvars.ContextVar("accel_deferred_fsync", default=None)
)


def _fsync(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a written file to disk (in the background inside `deferred_fsync`)."""
    deferred = _DEFERRED.get()
    if deferred is None:
        _fsync(path)
    elif deferred is False:  # inside deferred_fsync(enabled=False)
        return
    else:
        pool, futures = deferred
        futures.append(pool.submit(_fsync, path))


@contextlib.contextmanager
def deferred_fsync(max_workers: int = 4, enabled: bool = True) -> Iterator[None]:
    """Run the fsyncs of the block in background threads; wait for all of them on exit.

    ``enabled=False`` skips them: the files reach the disk when the OS writes them back.
    """
    if not enabled:
        token = _DEFERRED.set(False)
        try:
            yield
        finally:
            _DEFERRED.reset(token)
        return
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="accel-fsync") as pool:
        futures: list[Future] = []
        token = _DEFERRED.set((pool, futures))
        try:
            yield
        finally:
            _DEFERRED.reset(token)
            for future in futures:
                future.result()


def fsync_dir(path: str | os.PathLike[str]) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_object(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save, then fsync."""
    torch.save(obj, path)
    fsync_file(path)
