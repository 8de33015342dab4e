"""Loading a checkpoint that lives in an object store (an fsspec URL such as ``s3://b/model``).

`store_checkpoint_files` finds the files as `checkpoint_files` does for a local path: one
object, an index json, or a folder (prefix) holding either. `load_from_store` feeds their
tensors to the same `Placer` as the local readers, with no copy on local disk:

- a safetensors shard's header is read with one ranged read (two for a header over 64 KiB);
- the bytes of the tensors to load are read with ranged reads, run at once by the reader's
  threads: neighbouring tensors share one read (`_GAP`), a large tensor is split over several,
  and reads are about the bytes to load over the threads (8 MiB to 256 MiB, a file's reads
  of even size); each read's response is streamed straight into the tensors
  (`_store.read_into`), so a read holds no buffer of its own;
- a tensor that does not become the model's own as read (a dtype change, a GPU, disk) is
  allocated only while such tensors not yet placed stay within the reader's `buffer_size`,
  so memory beyond the model stays near that budget however large a shard is;
- a ``.bin`` / ``.pt`` file is read whole into memory and opened with
  ``torch.load(weights_only=True)``.

Tensors mapped to "disk" are written to the (local) offload folder, as for a ``.bin`` file.
Every store access goes through `_store` (its errors name the URL and the fix).
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import torch

from accel_bigmodel import _store
from accel_bigmodel._device_kinds import is_host
from accel_bigmodel._header import (
    DTYPES,
    TensorInfo,
    corrupt_at,
    read_safetensors_header,
    reads_natively,
)
from accel_bigmodel._layout import choose, index_shards
from accel_bigmodel._placer import Placer, Plan
from accel_bigmodel._pread import _buffer
from accel_bigmodel._progress import Progress
from accel_bigmodel._reader import CheckpointReader
from accel_bigmodel._sources import _read_device, corrupt

_GAP = 256 * 2**10  # tensors this close share one read (the gap is read and dropped)
_MIN_PART, _MAX_PART = 8 * 2**20, 256 * 2**20


def store_checkpoint_files(url: str) -> list[str]:
    """The objects making up the checkpoint at `url` (an object, an index json, or a folder),
    in load order, as URLs; the rules of `checkpoint_files`."""
    _store.check_store(url, write=False)  # a missing bucket, no credentials, no endpoint
    found = _store.kind(url)
    if found == "file":
        return _shards_from_index(url) if url.endswith(".json") else [url]
    if found is None:
        raise FileNotFoundError(
            f"Checkpoint {url!r} is neither an object nor a folder (prefix) in its store: "
            f"check the URL (the bucket exists, but nothing is stored under that name)."
        )
    index, name = choose(url, _store.list_names(url))
    chosen = _store.join(url, name)
    return _shards_from_index(chosen) if index else [chosen]


def _shards_from_index(index_url: str) -> list[str]:
    """The shard objects an index names (`_checkpoint._shards_from_index` for a URL)."""
    names = index_shards(_store.read_bytes(index_url), index_url)
    folder = index_url.rsplit("/", 1)[0]
    present = set(_store.files_under(folder)) if any("/" in n for n in names) else None
    if present is None:
        present = set(_store.list_names(folder))
    missing = [_store.join(folder, n) for n in names if n.strip("/") not in present]
    if missing:
        raise FileNotFoundError(
            f"The checkpoint index {index_url} lists shard(s) that do not exist: {missing}."
        )
    return [_store.join(folder, n) for n in names]


def check_store_reader(reader: CheckpointReader, checkpoint: str) -> None:
    """Refuse the readers that read local files only (and a big-endian machine)."""
    if not reads_natively():
        raise ValueError(
            "Loading from an object store reads little-endian bytes as they are, and this "
            "machine is big-endian; download the checkpoint and load it with reader='mmap'."
        )
    if reader.backend not in ("auto", "accel"):
        raise ValueError(
            f"reader={reader.backend!r} reads local files, and the checkpoint {checkpoint} is in "
            f"an object store: use reader='auto' (ranged reads from the store), or download "
            f"the checkpoint (accel_bigmodel.stores.download) and load the local copy."
        )


def load_from_store(
    placer: Placer, files: list[str], reader: CheckpointReader, progress: Progress
) -> None:
    """Feed every tensor of the objects `files` (URLs) to `placer` (see the module's doc)."""
    safetensors = [f for f in files if f.endswith(".safetensors")]
    threads = reader.resolved_threads
    with ThreadPoolExecutor(min(threads, max(1, len(safetensors)))) as pool:
        headers = list(pool.map(_header, safetensors))
    work: list[tuple[TensorInfo, Plan]] = []
    for infos in headers:
        todo = []
        for info in infos:
            plan = placer.plan(info.name)
            if plan is not None:
                todo.append((info, plan))
        work.extend(sorted(todo, key=lambda item: item[0].offset))
        if not todo:
            progress.update()
    remaining: dict[str, int] = {}
    for info, _ in work:
        remaining[info.path] = remaining.get(info.path, 0) + 1
    budget = reader.resolved_buffer_size
    infos = [info for info, _ in work]
    costs = [0 if _kept(placer, info, plan) else info.nbytes for info, plan in work]
    part = min(_MAX_PART, max(_MIN_PART, -(-sum(i.nbytes for i in infos) // threads)))
    stream = stream_ranges(infos, threads, budget, part, costs)
    for (info, plan), raw in zip(work, stream, strict=True):
        tensor = raw.view(info.dtype).reshape(info.shape)
        final = placer.final_dtype(plan, info.dtype)
        placer.put(info.name, plan, tensor if final == info.dtype else tensor.to(final))
        remaining[info.path] -= 1
        if not remaining[info.path]:
            progress.update()
    for url in files:
        if not url.endswith(".safetensors"):
            _load_torch_file(placer, url)
            progress.update()


def _kept(placer: Placer, info: TensorInfo, plan: Plan) -> bool:
    """Whether the tensor read for `info` becomes the model's own (host memory, same dtype):
    then it is no memory beyond the model's."""
    same = placer.final_dtype(plan, info.dtype) == info.dtype
    return same and plan.target is not None and is_host(_read_device(plan.device))


def _header(url: str) -> list[TensorInfo]:
    infos = []
    for t in read_safetensors_header(url):
        if t.dtype not in DTYPES:
            raise ValueError(
                f"{url}: tensor {t.name!r} has dtype {t.dtype!r}, which torch "
                f"{torch.__version__} cannot hold (known: {sorted(DTYPES)}). Download the "
                f"checkpoint and load it with reader='mmap', or convert it."
            )
        infos.append(TensorInfo(t.name, url, t.offset, t.nbytes, DTYPES[t.dtype], t.shape))
    return infos


class _Read(NamedTuple):
    """One ranged read: bytes [start, end) of `url`, copied into `pieces` =
    (tensor index, byte offset in the tensor, offset in the file, nbytes)."""

    url: str
    start: int
    end: int
    pieces: list[tuple[int, int, int, int]]


def plan_reads(infos: Sequence[TensorInfo], part: int) -> list[_Read]:
    """The ranged reads that bring in `infos` (in order; each file's tensors by offset).

    A tensor over `part` bytes is split into reads of `part` bytes; neighbours within `_GAP`
    share a read of at most `part` bytes, which takes tensors until it holds the file's share
    (its bytes over the fewest reads of `part` bytes), so a file's reads come out even rather
    than full ones and a small last one.
    """
    totals: dict[str, int] = {}
    for info in infos:
        totals[info.path] = totals.get(info.path, 0) + info.nbytes
    share = {path: -(-total // -(-total // part)) for path, total in totals.items() if total}
    reads: list[_Read] = []
    for i, info in enumerate(infos):
        for begin in range(0, info.nbytes, part):
            n = min(part, info.nbytes - begin)
            start = info.offset + begin
            last = reads[-1] if reads else None
            if (
                last is not None
                and last.url == info.path
                and 0 <= start - last.end <= _GAP
                and start + n - last.start <= part
                and sum(p[3] for p in last.pieces) < share[info.path]
            ):
                last.pieces.append((i, begin, start, n))
                reads[-1] = last._replace(end=start + n)
            else:
                reads.append(_Read(info.path, start, start + n, [(i, begin, start, n)]))
    return reads


def stream_ranges(
    infos: Sequence[TensorInfo],
    threads: int,
    budget: int,
    part: int,
    costs: Sequence[int] | None = None,
) -> Iterator[torch.Tensor]:
    """The bytes of each of `infos` as a new uint8 tensor, in order, each yielded once complete.

    Up to `threads` ranged reads (`plan_reads`, streamed into the tensors by
    `_store.read_into`) run at once. A tensor is allocated when its first read is queued, and
    reads are queued only while the `costs` (default: the sizes) of the tensors not yet
    yielded stay within `budget`; the tensor next in line is always read whole, so one over the
    budget, or a read that starts a new one, may go past it by that tensor.
    """
    costs = [info.nbytes for info in infos] if costs is None else costs
    reads = plan_reads(infos, part)
    first_read: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for r, read in enumerate(reads):
        for i, *_ in read.pieces:
            first_read.setdefault(i, r)
            last_read[i] = r
    outs: dict[int, torch.Tensor] = {}
    waits: dict[int, list[Future]] = {}
    pending: deque[int] = deque()
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="accel-store-read")
    ahead, r, index = 0, 0, 0
    try:
        while index < len(infos):
            while r < len(reads):
                read = reads[r]
                new = [i for i, *_ in read.pieces if first_read[i] == r]
                cost = sum(costs[i] for i in new)
                if pending and ahead + cost > budget and last_read[pending[0]] < r:
                    break  # (the next tensor's reads are all queued)
                for i in new:
                    outs[i] = torch.empty(infos[i].nbytes, dtype=torch.uint8)
                    waits[i] = []
                    pending.append(i)
                ahead += cost
                views = [
                    (start, _buffer(outs[i])[begin : begin + n])
                    for i, begin, start, n in read.pieces
                ]
                future = pool.submit(_fetch, read, views, infos[read.pieces[0][0]])
                for i in {i for i, *_ in read.pieces}:
                    waits[i].append(future)
                r += 1
            if index not in outs and not infos[index].nbytes:  # a tensor of no bytes
                yield torch.empty(0, dtype=torch.uint8)
                index += 1
                continue
            i = pending.popleft()
            assert i == index
            for future in waits.pop(i):
                future.result()
            ahead -= costs[i]
            index += 1
            yield outs.pop(i)
    finally:
        for futures in waits.values():
            for future in futures:
                future.cancel()
        pool.shutdown(wait=True)


def _fetch(read: _Read, views: list[tuple[int, memoryview]], first: TensorInfo) -> None:
    try:
        _store.read_into(read.url, read.start, read.end, views)
    except EOFError as e:
        raise corrupt_at(
            read.url, read.start, f"the object ended while reading {first.name!r} ({e})"
        ) from None


def _load_torch_file(placer: Placer, url: str) -> None:
    """A ``.bin`` / ``.pt`` object: read whole into memory, then ``torch.load``."""
    data = _store.read_bytes(url)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        raise corrupt(url, e) from e
    del data
    if not isinstance(state, Mapping):
        raise ValueError(f"{url} holds a {type(state).__name__}, not a state dict of tensors.")
    for name in list(state):
        value = state.pop(name)
        plan = placer.plan(name)
        if plan is not None:
            placer.put(name, plan, value)
