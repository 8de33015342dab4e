"""Reading safetensors shards at the speed of the disk.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, offsets relative to the end of
the header) and the raw little-endian bytes. `read_header` parses and checks it.

Two ways in, chosen per tensor by `_sources.load_accel`:

- Tensors that stay in host memory in their stored dtype view a private map of the file
  (`map_file`, `mapped_tensor`). A shard not in the page cache (`is_cached`) is brought in by
  `FaultIn`: a few threads fault large runs of pages in, in the model's order, with
  ``madvise(MADV_POPULATE_READ)``. The kernel reads straight into the page cache and maps those
  pages: no copy, no fresh memory to fault in page by page, no Python per byte.
- Tensors that change dtype or go to a GPU: `stream_tensors` reads them with a few threads doing
  large positional reads (``os.preadv``) into new tensors, in the order given, handing each back
  as soon as it is complete; the new memory is faulted in with one call per chunk
  (``MADV_POPULATE_WRITE``), not a page at a time inside the copy. A tensor that changes dtype
  or goes to a GPU is read through a small pool of staging buffers (pinned for CUDA) and
  converted or copied chunk by chunk, so memory beyond the model stays within the buffer
  budget. (Converting straight from the shard's map would save the staging copy, but the
  kernel maps whole large folios around each chunk, so the process's resident memory would
  grow past that budget by an amount that depends on the page cache's state.)
"""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import queue
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from accel_bigmodel._offload import _ST_DTYPES
from accel_bigmodel._sizes import convert_file_size_to_int

BACKENDS = ("auto", "accel", "mmap", "runai", "fastsafetensors")
DEFAULT_THREADS = 8
DEFAULT_BUFFER_SIZE = 256 * 2**20
_MAX_CHUNK = 16 * 2**20
_MIN_CHUNK = 2**20
_MAX_HEADER = 100 * 2**20  # safetensors' own limit

_DTYPES = dict(_ST_DTYPES)
for _name, _attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if isinstance(getattr(torch, _attr, None), torch.dtype):
        _DTYPES[_name] = getattr(torch, _attr)


@dataclass(frozen=True, kw_only=True)
class CheckpointReader:
    """How checkpoint shards are read: the backend and, for "accel", its threads and buffer.

    `backend`: "auto" (the default: "accel" for safetensors shards, torch.load for .bin/.pt),
    "accel" (see below), "mmap" (safetensors' memory map, one tensor at a time), "runai"
    (runai-model-streamer) or "fastsafetensors" (fastsafetensors); the last two must be
    installed. `threads` (default 8) read at once; `buffer_size` (bytes or "256MiB", the
    default) bounds the memory the reader holds beyond the model's own tensors.

    "accel" (and "auto") serve tensors that stay in host memory in their stored dtype as views
    of a private map of their shard, as safetensors' own loader does: no copy and no fresh
    memory. A shard not in the page cache is brought in by `threads` threads faulting large
    runs in, in the model's order. Tensors that change dtype or go to a GPU are read with
    large positional reads into new tensors (through staging buffers). `map_cached=False`
    reads every tensor into new memory instead of mapping. `overlap` (default True): the load
    returns while a cold shard is still coming in, and each module's forward first waits for
    its own tensors, so the first forward runs alongside the reading; False waits for all.
    """

    backend: str = "auto"
    threads: int | None = None
    buffer_size: int | str | None = None
    map_cached: bool = True
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"Unknown checkpoint reader {self.backend!r}; choose one of {list(BACKENDS)} "
                f'(e.g. reader="accel", or reader=CheckpointReader(backend="accel", threads=8)).'
            )
        threads = self.threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise ValueError(f"CheckpointReader threads={threads!r} must be an int >= 1.")
        if threads is not None and threads < 1:
            raise ValueError(f"CheckpointReader threads={threads} must be >= 1 (e.g. 8).")
        if self.buffer_size is not None:
            size = convert_file_size_to_int(self.buffer_size)
            if size < _MIN_CHUNK:
                raise ValueError(
                    f"CheckpointReader buffer_size={self.buffer_size!r} is below 1MiB; give at "
                    f'least "1MiB" (the default is "256MiB").'
                )
        for flag in ("map_cached", "overlap"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"CheckpointReader {flag}={getattr(self, flag)!r} must be a bool.")
        honoured = {"mmap": (), "runai": (), "fastsafetensors": ("threads",)}
        if self.backend in honoured:
            tuned = [k for k in ("threads", "buffer_size") if getattr(self, k) is not None]
            tuned += [k for k in ("map_cached", "overlap") if not getattr(self, k)]
            ignored = [k for k in tuned if k not in honoured[self.backend]]
            if ignored:
                raise ValueError(
                    f"CheckpointReader(backend={self.backend!r}) cannot honour "
                    f"{', '.join(f'{k}={getattr(self, k)!r}' for k in ignored)}: these tune the "
                    f"'accel' reader (fastsafetensors takes threads only). Drop them or use "
                    f"backend='accel'."
                )

    @property
    def resolved_threads(self) -> int:
        return DEFAULT_THREADS if self.threads is None else self.threads

    @property
    def resolved_buffer_size(self) -> int:
        if self.buffer_size is None:
            return DEFAULT_BUFFER_SIZE
        return convert_file_size_to_int(self.buffer_size)


def as_reader(reader: str | CheckpointReader | None) -> CheckpointReader:
    """`reader` as a CheckpointReader: a backend name is shorthand for CheckpointReader(backend=)."""
    if reader is None:
        return CheckpointReader()
    if isinstance(reader, CheckpointReader):
        return reader
    if isinstance(reader, str):
        return CheckpointReader(backend=reader)
    raise ValueError(
        f"reader={reader!r} is neither a backend name nor a CheckpointReader; pass one of "
        f"{list(BACKENDS)} or CheckpointReader(backend=..., threads=..., buffer_size=...)."
    )


class TensorInfo(NamedTuple):
    """Where one tensor's bytes sit in a safetensors file (`offset` from the file's start)."""

    name: str
    path: str
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class UnsupportedDtype(ValueError):
    """The file stores a dtype this torch cannot hold."""


def _bad(path: str, offset: int, what: str) -> ValueError:
    return ValueError(
        f"Cannot read the checkpoint shard {path} at byte {offset}: {what}. The file is "
        f"corrupt or truncated; save or download it again."
    )


def read_header(path: str) -> list[TensorInfo]:
    """The tensors of the safetensors file `path`, checked against the file's size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise _bad(path, len(raw), f"the file has {size} bytes, fewer than the 8 of a header")
        (length,) = struct.unpack("<Q", raw)
        if length > min(_MAX_HEADER, size - 8):
            raise _bad(path, 0, f"the header length {length} does not fit in {size} bytes")
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as e:
            raise _bad(path, 8, f"the JSON header does not parse ({e})") from None
    if not isinstance(header, dict):
        raise _bad(path, 8, "the JSON header is not an object")
    header.pop("__metadata__", None)
    start, end_of_data = 8 + length, size - 8 - length
    infos = []
    for name, entry in header.items():
        try:
            kind, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            numel = 1
            for dim in shape:
                if not isinstance(dim, int) or dim < 0:
                    raise TypeError(dim)
                numel *= dim
        except (KeyError, TypeError, ValueError):
            raise _bad(path, 8, f"the entry of {name!r} is malformed: {entry!r}") from None
        if kind not in _DTYPES:
            raise UnsupportedDtype(
                f"{path}: tensor {name!r} has dtype {kind!r}, which torch {torch.__version__} "
                f"cannot hold (known: {sorted(_DTYPES)}). Use reader='mmap' or convert it."
            )
        dtype = _DTYPES[kind]
        nbytes = numel * _itemsize(dtype)
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise _bad(path, 8, f"{name!r} has invalid data_offsets {[begin, end]}")
        if end - begin != nbytes:
            raise _bad(path, start + begin, f"{name!r} spans {end - begin} bytes, not {nbytes}")
        if end > end_of_data:
            raise _bad(
                path, size, f"{name!r} needs bytes {start + begin}..{start + end} but the file ends"
            )
        infos.append(TensorInfo(name, path, start + begin, nbytes, dtype, shape))
    return infos


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def reads_natively() -> bool:
    """Raw bytes become tensors without swapping: safetensors files are little-endian."""
    return sys.byteorder == "little"


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


class _Files:
    """File descriptors opened once per path, shared by the reading threads."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            return self._fds[path]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


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
            raise _bad(
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

    def __init__(self, files: _Files, chunk: int, staging_count: int, stats: ReadStats) -> None:
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
        _populate(address, len(view), _MADV_POPULATE_WRITE)
        _pread_into(self.files.fd(info.path), view, info.offset + start, info)

    def staged(self, info: TensorInfo, out: torch.Tensor, first: int, count: int) -> None:
        """Read elements [first, first + count) of `info` and copy them into `out` (flat)."""
        size = _itemsize(info.dtype)
        cuda = out.device.type == "cuda"
        pool = self.staging(cuda)
        buf = pool.free.get()
        try:
            raw = buf[: count * size]
            _pread_into(self.files.fd(info.path), _buffer(raw), info.offset + first * size, info)
            src = raw.view(info.dtype)
            if not cuda:
                dest = out[first : first + count]
                _populate(dest.data_ptr(), count * out.element_size(), _MADV_POPULATE_WRITE)
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


_MADV_POPULATE_READ = 22  # Linux 5.14+: fault pages in (reading them) without copying them
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, in one call


def _populate(address: int, nbytes: int, advice: int) -> bool:
    """Fault the pages of [address, address + nbytes) in with one ``madvise`` call; False where
    the call is missing or refused (the caller's copy or read then faults them itself).

    POPULATE_WRITE: fresh memory before it is written, not a fault per 4 KiB page inside the
    copy (a quarter less CPU here). POPULATE_READ: a file's mapped pages, read with large
    requests into the page cache and mapped, without a copy (`FaultIn`).
    """
    madvise = _libc_madvise()
    if madvise is None or nbytes <= 0:
        return False
    start = address - address % mmap.PAGESIZE
    size = ctypes.c_size_t(address + nbytes - start)
    return not madvise(ctypes.c_void_p(start), size, advice)


def _read_range(fd: int, begin: int, end: int, scratch: memoryview) -> None:
    """Read bytes [begin, end) of `fd` through `scratch` (their contents are not kept): the pages
    land in the page cache. Stops quietly at the file's end."""
    pos = begin
    while pos < end:
        n = os.preadv(fd, [scratch[: min(len(scratch), end - pos)]], pos)
        if n <= 0:
            return
        pos += n


def _chunk_size(buffer_size: int, threads: int) -> int:
    chunk = min(_MAX_CHUNK, max(_MIN_CHUNK, buffer_size // (4 * threads)))
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
    pools = {r.device.type != "cpu" for r in requests if _needs_staging(r)}
    limit = buffer_size - len(pools) * staging_count * chunk
    files = _Files()
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
    if request.device.type != "cpu":
        return 0  # host memory is only the staging buffers
    numel = request.info.nbytes // _itemsize(request.info.dtype)
    return numel * _itemsize(request.dtype)


def _needs_staging(request: ReadRequest) -> bool:
    return request.device.type != "cpu" or request.dtype != request.info.dtype


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
    per_chunk = max(1, chunk // _itemsize(info.dtype))
    numel = flat.numel()
    for first in range(0, numel, per_chunk):
        count = min(per_chunk, numel - first)
        futures.append(pool.submit(engine.staged, info, flat, first, count))
    return out, futures


def map_file(path: str) -> mmap.mmap | None:
    """A private (copy-on-write) map of `path`, or None for an empty file or off Linux."""
    if not sys.platform.startswith("linux") or os.path.getsize(path) == 0:
        return None
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


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
    Their page ranges are cut into runs of up to `chunk` bytes (neighbouring small tensors
    share a run) and `threads` threads fault the runs in, front to back, with
    ``madvise(MADV_POPULATE_READ)``: the kernel reads each run with large requests into the page
    cache and maps it, with no copy and no fresh memory (the tensors are the cache's pages, as
    with safetensors' own memory map). Where that call is missing, a run is read with
    ``preadv`` into a small reused buffer instead (which leaves it in the page cache).
    `wait(i)` blocks until item i is in; the tensors are valid all along (touching a page that
    is not in yet reads it on the spot).
    """

    def __init__(
        self,
        items: Sequence[tuple[str, mmap.mmap, int, int]],
        threads: int = DEFAULT_THREADS,
        chunk: int = 8 * 2**20,
    ) -> None:
        page = mmap.PAGESIZE
        chunk = max(page, chunk - chunk % page)
        self.order: list[int] = []  # items in the order they came in
        self._paths: list[str] = []
        self._maps: list[mmap.mmap] = []
        self._bases: list[int] = []
        self._anchors: list[ctypes.c_char] = []
        self._index: dict[int, int] = {}
        self._jobs: list[tuple[int, int, int, list[int]]] = []  # (map, begin, end, items)
        self._remaining = [0] * len(items)
        for i, (path, mapped, offset, nbytes) in enumerate(items):
            m = self._map_index(path, mapped)
            begin = offset - offset % page
            end = min(len(mapped), -(-(offset + nbytes) // page) * page) if nbytes else begin
            pos = begin
            last = self._jobs[-1] if self._jobs else None
            if last and last[0] == m and last[1] <= begin <= last[2] and last[1] + chunk > begin:
                pos = max(last[2], min(end, last[1] + chunk))
                self._jobs[-1] = (m, last[1], pos, [*last[3], i])
                self._remaining[i] += 1
            while pos < end:
                stop = min(end, pos + chunk)
                self._jobs.append((m, pos, stop, [i]))
                self._remaining[i] += 1
                pos = stop
        self._done = [r == 0 for r in self._remaining]
        self.order = [i for i, done in enumerate(self._done) if done]
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], object]] = []
        self._next = 0
        self._pid = os.getpid()
        count = max(1, min(threads, len(self._jobs))) if self._jobs else 0
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

    def _take(self) -> tuple[int, int, int, list[int]] | None:
        with self._cond:
            if self._next >= len(self._jobs) or self._error is not None:
                return None
            self._next += 1
            return self._jobs[self._next - 1]

    def _work(self) -> None:
        populate = True
        files = _Files()
        scratch: memoryview | None = None
        try:
            while (job := self._take()) is not None:
                m, begin, end, members = job
                if populate:  # not supported here: read through the page cache from now on
                    populate = _populate(self._bases[m] + begin, end - begin, _MADV_POPULATE_READ)
                if not populate:
                    scratch = scratch or memoryview(bytearray(min(_MAX_CHUNK, end - begin)))
                    _read_range(files.fd(self._paths[m]), begin, end, scratch)
                with self._cond:
                    for i in members:
                        self._remaining[i] -= 1
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


@functools.cache
def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def mapped_tensor(mapped: mmap.mmap, info: TensorInfo) -> torch.Tensor | None:
    """`info`'s tensor as a view of `mapped` (its own storage), or None if it is misaligned."""
    if info.nbytes == 0:
        return torch.empty(info.shape, dtype=info.dtype)
    if info.offset % _itemsize(info.dtype):
        return None
    count = info.nbytes // _itemsize(info.dtype)
    flat = torch.frombuffer(mapped, dtype=info.dtype, count=count, offset=info.offset)
    return flat.view(info.shape)


WARM_THREADS = 4
_WARM_READ = 8 * 2**20


def warm_page_cache(
    ranges: Iterable[tuple[str, int, int]], threads: int = WARM_THREADS
) -> list[threading.Thread]:
    """Read (path, offset, nbytes) ranges into the page cache ahead of use, from background
    threads.

    Used for tensors left on disk and memory-mapped at run time: their pages arrive in forward
    order, read by `threads` threads issuing 8 MiB ``preadv`` calls (the disk's parallel
    bandwidth, as `FaultIn` reads), while the model starts running, instead of one fault at a
    time. A single ``posix_fadvise(WILLNEED)`` stream measured 1.4-1.5x the parallel read
    floor here; 4 reading threads 1.0-1.07x. The reads land in one shared 8 MiB scratch buffer
    whose contents are never looked at: the page cache is what is kept. Files already in the
    page cache are skipped (copying them would only take CPU from the forward). It is a hint:
    it holds no other memory, and errors are ignored. Returns the threads (daemons).
    """
    if not hasattr(os, "preadv"):
        return []
    ranges = list(ranges)
    cached = {path: _file_is_cached(path) for path in {path for path, _, _ in ranges}}
    jobs: deque[tuple[str, int, int]] = deque(
        (path, start, min(_WARM_READ, offset + nbytes - start))
        for path, offset, nbytes in ranges
        if not cached[path]
        for start in range(offset, offset + nbytes, _WARM_READ)
    )
    if not jobs:
        return []
    scratch = memoryview(bytearray(_WARM_READ))

    def run() -> None:
        files = _Files()
        try:
            while True:
                try:
                    path, start, length = jobs.popleft()
                except IndexError:
                    return
                _read_range(files.fd(path), start, start + length, scratch)
        except OSError:
            pass
        finally:
            files.close()

    workers = [
        threading.Thread(target=run, name="accel-warm", daemon=True)
        for _ in range(min(threads, len(jobs)))
    ]
    for worker in workers:
        worker.start()
    return workers


def _file_is_cached(path: str) -> bool:
    try:
        mapped = map_file(path)
    except OSError:
        return True  # nothing to read ahead that could be read
    if mapped is None:
        return False
    try:
        return is_cached(mapped)
    finally:
        mapped.close()
