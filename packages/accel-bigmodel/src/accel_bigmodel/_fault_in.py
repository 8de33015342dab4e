"""Tensors that view a private map of their shard, and the threads that fault cold pages in.

Tensors that stay in host memory in their stored dtype view a private (copy-on-write) map of
their file (`map_file`, `mapped_tensor`), as safetensors' own loader makes them: no copy, no
fresh memory. A shard not in the page cache (`is_cached`) is brought in by `FaultIn`: a few
threads read large runs of it into the page cache, in the model's order, each run with one
``preadv`` request through a small reused buffer; a tensor's pages are then mapped when it is
first touched, from the cache, 16 pages per fault (the kernel's fault-around). No fresh memory
and no Python per byte.

Why reads and not ``madvise(MADV_POPULATE_READ)`` on the map, which also maps the pages: its
faults read through the mapping's readahead window, in requests far shorter than the run. On
this project's development VM, faulting a 1.6 GB checkpoint in that way took 1.07-1.5x as long
as reading it with ``preadv`` at the best thread count and run length of the same sweep
(tools/bench/bench_cold_load.py: "map-TxM" against "par-TxM"); and accel's cold load + first
forward was 1.2-1.35x of the best read, against 1.0-1.1x with these reads.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence

import torch

from accel_bigmodel._file_io import SCRATCH, Files, read_range
from accel_bigmodel._header import TensorInfo
from accel_bigmodel._read_shape import pace_for


def map_private(path: str) -> mmap.mmap | None:
    """A private (copy-on-write) map of `path`, or None for an empty file."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def map_file(path: str) -> mmap.mmap | None:
    """`map_private(path)` on Linux (where the page cache is asked with mincore), else None."""
    return map_private(path) if sys.platform.startswith("linux") else None


def is_cached(mapped: mmap.mmap, samples: int = 256, window: int = 16) -> bool:
    """Whether the pages of `mapped` are in the page cache now (sampled with mincore).

    The check asks mincore about `samples` windows of `window` pages spread over the file (a
    whole-file walk costs ~7 ms per 400 MB, more than a warm load itself).
    """
    pages = -(-len(mapped) // mmap.PAGESIZE)
    status = (ctypes.c_ubyte * window)()
    anchor = ctypes.c_char.from_buffer(mapped)
    try:
        mincore = ctypes.CDLL(None, use_errno=True).mincore
        base = ctypes.addressof(anchor)
        step = max(window, pages // samples)
        for first in range(0, pages, step):
            count = min(window, pages - first)
            address = ctypes.c_void_p(base + first * mmap.PAGESIZE)
            if mincore(address, ctypes.c_size_t(count * mmap.PAGESIZE), status) or bytes(
                status[:count]
            ).count(0):
                return False
    finally:
        del anchor
    return True


def map_if_cached(path: str, samples: int = 256, window: int = 16) -> mmap.mmap | None:
    """A private map of `path` when its pages are in the page cache now, else None.

    A cached file needs no reading at all: tensors viewing the map (as safetensors' own loader
    makes them) cost only the mapping. Linux only; elsewhere files are read.
    """
    mapped = map_file(path)
    if mapped is None or is_cached(mapped, samples, window):
        return mapped
    mapped.close()
    return None


class FaultIn:
    """Bring mapped tensors' pages in from disk with a few threads, in the order given.

    `items` are (path, map, offset, nbytes) of tensors viewing private maps of their files.
    Their page ranges, merged where neighbours touch, are cut into runs (neighbouring small
    tensors share a run) that threads read into the page cache, in that order, each with one
    ``preadv`` request whose iovecs all point at one 1 MiB buffer per thread (`read_range`):
    the tensors are the cache's pages, as with safetensors' own memory map, mapped when first
    touched.
    How many threads and how long the runs: `threads` x `chunk` when given, else the shape
    chosen for the files' device (`_read_shape.pace_for`), which may change while reading.
    `wait(i)` blocks until item i is in; the tensors are valid all along (touching a page that
    is not in yet reads it on the spot).
    """

    def __init__(
        self,
        items: Sequence[tuple[str, mmap.mmap, int, int]],
        threads: int | None = None,
        chunk: int | None = None,
    ) -> None:
        page = mmap.PAGESIZE
        self._paths: list[str] = []
        self._maps: list[mmap.mmap] = []
        self._bases: list[int] = []
        self._anchors: list[ctypes.c_char] = []
        self._index: dict[int, int] = {}
        # Extents: [map, begin, end, items as (begin, end, i) by begin], in the order asked:
        # an item touching the one before it (on either side: a module's weight and bias are
        # often stored bias first) joins its extent, which is read front to back.
        extents: list[list] = []
        self._remaining = [0] * len(items)  # bytes of each item's pages not in yet
        self._spans = [(0, 0)] * len(items)
        for i, (path, mapped, offset, nbytes) in enumerate(items):
            if not nbytes:
                continue
            m = self._map_index(path, mapped)
            begin = offset - offset % page
            end = min(len(mapped), -(-(offset + nbytes) // page) * page)
            self._remaining[i] = end - begin
            self._spans[i] = (begin, end)
            last = extents[-1] if extents else None
            if last and last[0] == m and begin <= last[2] and end >= last[1]:  # touching
                last[1], last[2] = min(last[1], begin), max(last[2], end)
                last[3].append((begin, end, i))
            else:
                extents.append([m, begin, end, [(begin, end, i)]])
        self._extents = [(m, b, e, sorted(members)) for m, b, e, members in extents]
        self._cut = (0, self._extents[0][1] if self._extents else 0, 0)  # extent, pos, next item
        self._open: list[tuple[int, int, int]] = []  # items begun by earlier runs, not ended
        self._jobs: list[tuple[int, int, int, list[int]]] = []  # runs handed out, as asked
        self._busy = 0  # runs being read now
        self._done = [not r for r in self._remaining]
        self.order: list[int] = [i for i, done in enumerate(self._done) if done]
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], object]] = []
        self._pid = os.getpid()
        total = sum(e - b for _, b, e, _ in self._extents)
        self._pace = pace_for(self._paths[0], total, threads, chunk) if total else None
        count = self._pace.max_threads if self._pace else 0
        self._alive = count
        self._threads = [
            threading.Thread(target=self._work, name="accel-fault-in", daemon=True)
            for _ in range(count)
        ]
        for thread in self._threads:
            thread.start()
        if not count:
            self._anchors.clear()

    def _map_index(self, path: str, mapped: mmap.mmap) -> int:
        key = id(mapped)
        if key not in self._index:
            self._index[key] = len(self._maps)
            self._paths.append(path)
            self._maps.append(mapped)
            anchor = ctypes.c_char.from_buffer(mapped)
            self._anchors.append(anchor)
            self._bases.append(ctypes.addressof(anchor))
        return self._index[key]

    def _take(self) -> tuple[int, int, int, list[int], int | None] | None:
        """The next run: (map, begin, end, the items it holds pages of, the pace's tag)."""
        with self._cond:
            while True:
                e, pos, k = self._cut
                if e >= len(self._extents) or self._error is not None:
                    return None
                if self._busy < self._pace.limit():
                    break
                self._cond.wait()  # as many runs in flight as the pace wants
            self._busy += 1
            m, _, end, members = self._extents[e]
            chunk = self._pace.chunk()
            stop = end if end - pos < chunk + chunk // 4 else pos + chunk  # no short tail
            tag = self._pace.handed(stop - pos)
            while k < len(members) and members[k][0] < stop:
                self._open.append(members[k])
                k += 1
            job = (m, pos, stop, [i for _, _, i in sorted(self._open, key=lambda t: t[2])])
            self._open = [t for t in self._open if t[1] > stop]
            if stop < end:
                self._cut = (e, stop, k)
            else:
                self._open = []
                e += 1
                self._cut = (e, self._extents[e][1] if e < len(self._extents) else 0, 0)
            self._jobs.append(job)
            return (*job, tag)

    def _work(self) -> None:
        files = Files()
        scratch = memoryview(bytearray(SCRATCH))
        try:
            while (job := self._take()) is not None:
                m, begin, end, members, tag = job
                started = time.perf_counter()
                read_range(files.fd(self._paths[m]), begin, end, scratch)
                self._pace.record(tag, end - begin, started, time.perf_counter())
                with self._cond:
                    self._busy -= 1
                    for i in members:
                        b, x = self._spans[i]
                        self._remaining[i] -= min(end, x) - max(begin, b)
                        if not self._remaining[i]:
                            self._done[i] = True
                            self.order.append(i)
                    self._cond.notify_all()
        except BaseException as e:  # handed to whoever waits
            with self._cond:
                self._error = e
        finally:
            files.close()
            with self._cond:
                self._alive -= 1
                callbacks = []
                if not self._alive:
                    self._anchors.clear()  # the maps may close once no tensor views them
                    if self._error is None:  # on an error the waiters keep raising it
                        callbacks, self._callbacks = self._callbacks, []
                self._cond.notify_all()
            for callback in callbacks:
                callback()

    def on_finish(self, callback: Callable[[], object]) -> None:
        """Call `callback` (from a reading thread) once every item is in, or now if they are."""
        with self._cond:
            if self._alive:
                self._callbacks.append(callback)
                return
            if self._error is not None:
                return
        callback()

    def wait(self, item: int) -> None:
        """Block until `item`'s pages are in; re-raise a reading thread's error.

        In a process forked from the loading one (no reading threads there) it returns at
        once: the map is valid and pages not in yet are read when touched.
        """
        if os.getpid() != self._pid:
            return
        with self._cond:
            while not self._done[item] and self._alive and self._error is None:
                self._cond.wait()
            if not self._done[item] and self._error is not None:
                raise OSError(f"Reading checkpoint pages failed: {self._error!r}") from self._error

    def join(self) -> None:
        """Block until every item is in; re-raise a reading thread's error."""
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise OSError(f"Reading checkpoint pages failed: {self._error!r}") from self._error

    @property
    def finished(self) -> bool:
        with self._cond:
            return not self._alive


def mapped_tensor(mapped: mmap.mmap, info: TensorInfo) -> torch.Tensor | None:
    """`info`'s tensor as a view of `mapped` (its own storage), or None if it is misaligned."""
    if info.nbytes == 0:
        return torch.empty(info.shape, dtype=info.dtype)
    if info.offset % info.dtype.itemsize:
        return None
    count = info.nbytes // info.dtype.itemsize
    flat = torch.frombuffer(mapped, dtype=info.dtype, count=count, offset=info.offset)
    return flat.view(info.shape)
