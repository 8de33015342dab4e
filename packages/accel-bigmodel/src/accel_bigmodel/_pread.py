"""Reading tensors into new memory with a few threads doing large positional reads.

`stream_tensors` reads tensors that change dtype or go to a GPU (and, with
``CheckpointReader(map_cached=False)``, every tensor) with ``os.preadv`` into new tensors, in
the order given, handing each back as soon as it is complete. The new memory is faulted in with
one call per chunk (``MADV_POPULATE_WRITE``), not a page at a time inside the copy. A tensor
that changes dtype or goes to a GPU is read through a small pool of staging buffers (pinned for
CUDA) and converted or copied chunk by chunk, so memory beyond the model stays within the buffer
budget. (Converting straight from the shard's map would save the staging copy, but the kernel
maps whole large folios around each chunk, so the process's resident memory would grow past
that budget by an amount that depends on the page cache's state.)
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from accel_bigmodel._device_kinds import copies_on_side_streams, is_host
from accel_bigmodel._file_io import MADV_POPULATE_WRITE, Files, populate
from accel_bigmodel._header import TensorInfo, corrupt_at
from accel_bigmodel._reader import DEFAULT_BUFFER_SIZE, DEFAULT_THREADS

MAX_CHUNK = 16 * 2**20
_MIN_CHUNK = 2**20


class ReadRequest(NamedTuple):
    """Read `info` into a new tensor of `dtype` on `device` (cpu or cuda)."""

    info: TensorInfo
    dtype: torch.dtype
    device: torch.device


@dataclass
class ReadStats:
    """What the reader held: the most bytes allocated ahead of the consumer, and staging."""

    peak_ahead_bytes: int = 0
    staging_bytes: int = 0
    bytes_read: int = 0
    order: list[str] = field(default_factory=list)


def _buffer(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview over a contiguous CPU tensor's bytes (no numpy)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _pread_into(fd: int, view: memoryview, offset: int, info: TensorInfo) -> None:
    done, total = 0, len(view)
    while done < total:
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[done:]], offset + done)
        else:  # platforms without preadv: a positioned read through a private handle
            with open(os.dup(fd), "rb", buffering=0) as f:
                f.seek(offset + done)
                n = f.readinto(view[done:]) or 0
        if n == 0:
            raise corrupt_at(
                info.path, offset + done,
                f"the file ended while reading {info.name!r} (bytes {info.offset}.."
                f"{info.offset + info.nbytes})",
            )  # fmt: skip
        done += n


class _Staging:
    """A fixed pool of chunk-sized buffers (pinned when feeding a GPU) shared by the threads."""

    def __init__(self, count: int, chunk: int, pin: bool) -> None:
        self.free: queue.Queue[torch.Tensor] = queue.Queue()
        for _ in range(count):
            self.free.put(torch.empty(chunk, dtype=torch.uint8, pin_memory=pin))
        self.bytes = count * chunk


class _Engine:
    """The work a reading thread does: direct reads, and staged reads with a copy."""

    def __init__(self, files: Files, chunk: int, staging_count: int, stats: ReadStats) -> None:
        self.files, self.chunk, self.staging_count, self.stats = files, chunk, staging_count, stats
        self._staging: dict[bool, _Staging] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    def staging(self, pin: bool) -> _Staging:
        with self._lock:
            if pin not in self._staging:
                self._staging[pin] = _Staging(self.staging_count, self.chunk, pin)
                self.stats.staging_bytes += self._staging[pin].bytes
            return self._staging[pin]

    def direct(self, info: TensorInfo, view: memoryview, start: int) -> None:
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        populate(address, len(view), MADV_POPULATE_WRITE)
        _pread_into(self.files.fd(info.path), view, info.offset + start, info)

    def staged(self, info: TensorInfo, out: torch.Tensor, first: int, count: int) -> None:
        """Read elements [first, first + count) of `info` and copy them into `out` (flat)."""
        size = info.dtype.itemsize
        cuda = copies_on_side_streams(out.device)
        pool = self.staging(cuda)
        buf = pool.free.get()
        try:
            raw = buf[: count * size]
            _pread_into(self.files.fd(info.path), _buffer(raw), info.offset + first * size, info)
            src = raw.view(info.dtype)
            if not cuda:
                dest = out[first : first + count]
                populate(dest.data_ptr(), count * out.element_size(), MADV_POPULATE_WRITE)
                dest.copy_(src)
                return
            streams = self._local.__dict__.setdefault("streams", {})  # one per thread and GPU
            stream = streams.get(out.device)
            if stream is None:
                stream = streams[out.device] = torch.cuda.Stream(out.device)
            with torch.cuda.stream(stream):
                moved = src.to(out.device, non_blocking=True)
                out[first : first + count].copy_(moved)
            stream.synchronize()  # the staging buffer is reused once the copy is done
        finally:
            pool.free.put(buf)


def _chunk_size(buffer_size: int, threads: int) -> int:
    chunk = min(MAX_CHUNK, max(_MIN_CHUNK, buffer_size // (4 * threads)))
    return chunk - chunk % 4096


def stream_tensors(
    requests: Sequence[ReadRequest],
    threads: int = DEFAULT_THREADS,
    buffer_size: int = DEFAULT_BUFFER_SIZE,
    stats: ReadStats | None = None,
) -> Iterator[tuple[ReadRequest, torch.Tensor]]:
    """Read each request into a new tensor; yield them in order, each as soon as it is complete.

    Up to `threads` reads run at once. The tensors allocated ahead of the consumer, plus the
    staging buffers, stay within `buffer_size` bytes (a single tensor larger than that is read
    alone). Closing the generator early stops the reads.
    """
    stats = ReadStats() if stats is None else stats
    chunk = _chunk_size(buffer_size, threads)
    staging_count = max(1, min(threads, buffer_size // (4 * chunk)))
    pools = {not is_host(r.device) for r in requests if _needs_staging(r)}
    limit = buffer_size - len(pools) * staging_count * chunk
    files = Files()
    engine = _Engine(files, chunk, staging_count, stats)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="accel-read")
    pending: deque[tuple[ReadRequest, torch.Tensor, list[Future], int]] = deque()
    ahead, index = 0, 0
    try:
        while pending or index < len(requests):
            while index < len(requests):
                request = requests[index]
                cost = _nbytes(request)
                if pending and ahead + cost > limit:
                    break
                tensor, futures = _submit(pool, engine, request, chunk)
                pending.append((request, tensor, futures, cost))
                ahead += cost
                stats.peak_ahead_bytes = max(stats.peak_ahead_bytes, ahead)
                index += 1
            request, tensor, futures, cost = pending.popleft()
            for future in futures:
                future.result()
            ahead -= cost
            stats.bytes_read += request.info.nbytes
            stats.order.append(request.info.name)
            yield request, tensor
    finally:
        for _, _, futures, _ in pending:
            for future in futures:
                future.cancel()
        pool.shutdown(wait=True)
        files.close()


def _nbytes(request: ReadRequest) -> int:
    if not is_host(request.device):
        return 0  # host memory is only the staging buffers
    numel = request.info.nbytes // request.info.dtype.itemsize
    return numel * request.dtype.itemsize


def _needs_staging(request: ReadRequest) -> bool:
    return not is_host(request.device) or request.dtype != request.info.dtype


def _submit(
    pool: ThreadPoolExecutor, engine: _Engine, request: ReadRequest, chunk: int
) -> tuple[torch.Tensor, list[Future]]:
    info = request.info
    out = torch.empty(info.shape, dtype=request.dtype, device=request.device)
    if info.nbytes == 0:
        return out, []
    futures = []
    if not _needs_staging(request):
        view = _buffer(out)
        for start in range(0, info.nbytes, chunk):
            part = view[start : start + chunk]
            futures.append(pool.submit(engine.direct, info, part, start))
        return out, futures
    flat = out.view(-1)
    per_chunk = max(1, chunk // info.dtype.itemsize)
    numel = flat.numel()
    for first in range(0, numel, per_chunk):
        count = min(per_chunk, numel - first)
        futures.append(pool.submit(engine.staged, info, flat, first, count))
    return out, futures
