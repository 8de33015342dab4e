"""Durable writes: fsync of files and folders, torch.save that is fsynced, and deferral.

Inside `deferred_fsync()`, `fsync_file` hands the fsync to background threads and returns at
once, so a file's flush to disk overlaps the writing of the next one; leaving the block waits
for every fsync (and raises the first error), so durability is unchanged for the caller.

Inside `parallel_writes()`, `deferred_write` hands each file's whole write (serialize, write,
fsync) to a pool of threads, so a checkpoint of several files is written by several streams at
once (torch.save and safetensors release the GIL while they write); leaving the block waits
for every file (and raises the first error).

Inside `staged_writes()` (an asynchronous checkpoint), `deferred_write` copies what it is
given to CPU memory and queues the write instead of doing it; the caller runs the queued jobs
later, in a background thread. Given a `StagingBuffers`, the copies go into the buffers the
previous asynchronous save of the same files used (same shapes and dtypes): the copy is then a
plain memory copy, without a page fault per 4 KiB of freshly allocated memory.
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

# Threads that write a checkpoint's files at once (and files per process in a DCP folder).
WRITE_THREADS = 4

_STAGED: contextvars.ContextVar[list[Callable[[], Any]] | None] = contextvars.ContextVar(
    "accel_staged_writes", default=None
)
_DEFERRED: contextvars.ContextVar[tuple[ThreadPoolExecutor, list[Future]] | bool | None] = (
    contextvars.ContextVar("accel_deferred_fsync", default=None)
)
_PARALLEL: contextvars.ContextVar[tuple[ThreadPoolExecutor, list[Future]] | None] = (
    contextvars.ContextVar("accel_parallel_writes", default=None)
)
_BUFFERS: contextvars.ContextVar[StagingBuffers | None] = contextvars.ContextVar(
    "accel_staging_buffers", default=None
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
    with _pool_block(_DEFERRED, max_workers, "accel-fsync"):
        yield


@contextlib.contextmanager
def _pool_block(var: contextvars.ContextVar, max_workers: int, prefix: str) -> Iterator[None]:
    """A thread pool that `var` hands to the code of the block (as ``(pool, futures)``); on
    exit, wait for every future and raise the first error."""
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=prefix) as pool:
        futures: list[Future] = []
        token = var.set((pool, futures))
        try:
            yield
        finally:
            var.reset(token)
            errors = [f.exception() for f in futures]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first


def fsync_enabled() -> bool:
    """False inside `deferred_fsync(enabled=False)` (writers that flush on their own, such as
    DCP's, follow it)."""
    return _DEFERRED.get() is not False


@contextlib.contextmanager
def parallel_writes(max_workers: int = WRITE_THREADS) -> Iterator[None]:
    """Write the files of the block (`deferred_write`, `save_object`) from `max_workers`
    threads at once; wait for all of them on exit, raising the first error.

    Each write runs in a copy of the caller's context (a surrounding `deferred_fsync` applies
    to it). The objects handed over must not change until the block ends: the caller waits
    in it, so a synchronous save needs no copies."""
    with _pool_block(_PARALLEL, max_workers, "accel-write"):
        yield


def run_parallel(jobs: list[Callable[[], Any]], max_workers: int = WRITE_THREADS) -> None:
    """Run `jobs` (as `staged_writes` collected them) from `max_workers` threads at once, each
    in a copy of the caller's context; wait for all of them, raising the first error."""
    with parallel_writes(max_workers):
        for job in jobs:
            _submit(job)


def _submit(job: Callable[[], Any]) -> bool:
    """Hand `job` to the surrounding `parallel_writes` pool; False when there is none."""
    parallel = _PARALLEL.get()
    if parallel is None:
        return False
    pool, futures = parallel
    futures.append(pool.submit(contextvars.copy_context().run, job))
    return True


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


class StagingBuffers:
    """CPU buffers kept from one asynchronous save to the next, per file: the n-th tensor of a
    file's object is copied into the n-th buffer the previous save of that file used when its
    shape, stride and dtype match (a new one is allocated otherwise). Keep one per run and
    start a save only after the previous one is written (its buffers are then free)."""

    def __init__(self) -> None:
        self._files: dict[str, list[torch.Tensor]] = {}
        self._taken: set[str] = set()

    def begin(self) -> None:
        """A new save starts: every file's buffers may be reused once."""
        self._taken = set()

    def copier(self, path: str | os.PathLike[str]) -> Callable[[torch.Tensor], torch.Tensor]:
        """The copy function for the tensors of the file at `path` (keyed by its name)."""
        key = os.path.basename(os.fspath(path))
        if key in self._taken:  # a second file of that name in this save: fresh memory
            return _fresh_copy
        self._taken.add(key)
        old = self._files.get(key, [])
        new: list[torch.Tensor] = []
        self._files[key] = new

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            src = tensor.detach()
            i = len(new)
            buf = old[i] if i < len(old) else None
            if (
                buf is None
                or buf.shape != src.shape
                or buf.dtype != src.dtype
                or buf.stride() != src.stride()
            ):
                buf = src.to("cpu", copy=True)
            else:
                buf.copy_(src)
            new.append(buf)
            return buf

        return copy

    def clear(self) -> None:
        self._files.clear()
        self._taken = set()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self._files.values() for t in ts)


def _fresh_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def _cpu_copy(
    obj: Any,
    memo: dict[int, torch.Tensor] | None = None,
    copy: Callable[[torch.Tensor], torch.Tensor] = _fresh_copy,
) -> Any:
    """`obj` with every tensor copied to CPU memory (containers rebuilt, the rest shared); a
    tensor met twice (tied weights) is copied once, so the copies stay tied."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = copy(obj)
        return memo[id(obj)]
    if isinstance(obj, dict):
        return type(obj)((k, _cpu_copy(v, memo, copy)) for k, v in obj.items())
    if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
        return type(obj)(_cpu_copy(v, memo, copy) for v in obj)
    return obj


@contextlib.contextmanager
def staged_writes(buffers: StagingBuffers | None = None) -> Iterator[list[Callable[[], Any]]]:
    """Collect the writes of the block as jobs (on CPU copies) instead of doing them; with
    `buffers`, the copies reuse the previous save's buffers."""
    jobs: list[Callable[[], Any]] = []
    if buffers is not None:
        buffers.begin()
    token = _STAGED.set(jobs)
    buffers_token = _BUFFERS.set(buffers)
    try:
        yield jobs
    finally:
        _BUFFERS.reset(buffers_token)
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
    """`write(obj, path)` now (from a writer thread inside `parallel_writes`), or, inside
    `staged_writes`, later on a CPU copy of `obj`."""
    jobs = _STAGED.get()
    if jobs is None:
        if not _submit(lambda: write(obj, path)):
            write(obj, path)
        return
    buffers = _BUFFERS.get()
    copier = _fresh_copy if buffers is None else buffers.copier(path)
    copy = _cpu_copy(obj, copy=copier)
    jobs.append(lambda: write(copy, path))
