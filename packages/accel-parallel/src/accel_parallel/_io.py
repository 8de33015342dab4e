"""Durable writes: fsync of files and folders, torch.save that is fsynced, and deferral.

Inside `deferred_fsync()`, `fsync_file` hands the fsync to background threads and returns at
once, so a file's flush to disk overlaps the writing of the next one; leaving the block waits
for every fsync (and raises the first error), so durability is unchanged for the caller.

Inside `staged_writes()` (an asynchronous checkpoint), `deferred_write` copies what it is
given to CPU memory and queues the write instead of doing it; the caller runs the queued jobs
later, in a background thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

_STAGED: contextvars.ContextVar[list[Callable[[], Any]] | None] = contextvars.ContextVar(
    "accel_staged_writes", default=None
)
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


# A folder's fsync that the file system or platform does not support (not a failed write).
_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES}


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename into it) to disk.

    Where the platform cannot open or fsync a folder (Windows, some network file systems)
    this does nothing; an I/O error (EIO, ENOSPC, ...) is raised, naming the folder, so a
    checkpoint that did not reach the disk is never reported as saved. Inside
    `deferred_fsync(enabled=False)` it does nothing.
    """
    if _DEFERRED.get() is False:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        if os.name == "nt" or err.errno in _UNSUPPORTED | {errno.EISDIR}:
            return
        raise OSError(err.errno, f"could not open folder {path} to flush it: {err}") from err
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _UNSUPPORTED:
            raise OSError(err.errno, f"flushing folder {path} to disk failed: {err}") from err
    finally:
        os.close(fd)


def _write_object(obj: Any, path: str | os.PathLike[str]) -> None:
    torch.save(obj, path)
    fsync_file(path)


def save_object(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save, then fsync (queued, on a CPU copy, inside `staged_writes`)."""
    deferred_write(_write_object, obj, path)


def _cpu_copy(obj: Any, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """`obj` with every tensor copied to CPU memory (containers rebuilt, the rest shared); a
    tensor met twice (tied weights) is copied once, so the copies stay tied."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = obj.detach().to("cpu", copy=True)
        return memo[id(obj)]
    if isinstance(obj, dict):
        return type(obj)((k, _cpu_copy(v, memo)) for k, v in obj.items())
    if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
        return type(obj)(_cpu_copy(v, memo) for v in obj)
    return obj


@contextlib.contextmanager
def staged_writes() -> Iterator[list[Callable[[], Any]]]:
    """Collect the writes of the block as jobs (on CPU copies) instead of doing them."""
    jobs: list[Callable[[], Any]] = []
    token = _STAGED.set(jobs)
    try:
        yield jobs
    finally:
        _STAGED.reset(token)


def staging() -> bool:
    """Whether writes are being staged for a background thread (`staged_writes`)."""
    return _STAGED.get() is not None


def add_job(job: Callable[[], Any]) -> None:
    """Queue `job` with the staged writes (run it now when nothing is staged)."""
    jobs = _STAGED.get()
    if jobs is None:
        job()
    else:
        jobs.append(job)


def deferred_write(
    write: Callable[[Any, Any], None], obj: Any, path: str | os.PathLike[str]
) -> None:
    """`write(obj, path)` now, or, inside `staged_writes`, later on a CPU copy of `obj`."""
    jobs = _STAGED.get()
    if jobs is None:
        write(obj, path)
        return
    copy = _cpu_copy(obj)
    jobs.append(lambda: write(copy, path))
