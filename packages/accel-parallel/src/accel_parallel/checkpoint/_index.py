"""accel's chunk index of a DCP folder: each resuming rank reads only the chunks it needs.

DCP's ``.metadata`` lists every chunk of every key with its file, offset and length: N chunks
per key over N ranks, and torch's loader has every rank read and unpickle all of it (an 8B
model's folder holds ~40 KB of it per rank: 113 MB at 2,816 ranks, read by each of them). The
coordinator of an accel save also writes the same entries as a file of its own,
``.accel_chunks`` (`DCP_INDEX`), laid out for lookups: a header with every key's size and
properties, then, for each key of many chunks in order along dim 0 (an FSDP2 Shard(0) key), a
table of fixed-width rows sorted by that order. A resuming rank (`IndexedReader`) reads the
header and, per key, bisects the table for the rows its own chunks overlap: O(keys x log N)
reads instead of O(keys x N). The Metadata it hands torch's planner holds those chunks only,
in the saved order, so the planner's reads are the ones it makes of the whole ``.metadata``.

The DCP files are untouched: torch's stock loader (and accelerate) read the folder as DCP
does, ignoring the index; a folder without one (written by torch or accelerate) is read
through ``.metadata``.
"""

from __future__ import annotations

import bisect
import mmap
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)

from accel_parallel.checkpoint._layout import DCP_INDEX

MAGIC = b"ACCELIX1"
_PREFIX = struct.Struct("<8sQ")  # magic, header length
# keys with at most this many chunks are kept whole in the header (replicated values: one)
WHOLE_UP_TO = 8


def _row_format(ndim: int, name_width: int) -> struct.Struct:
    """A chunk's row: its offsets and sizes, its file's offset and length, the file's name."""
    return struct.Struct(f"<{2 * ndim + 2}q{name_width}s")


def _ordered_along_0(chunks: list[Any]) -> bool:
    """Whether the chunks' dim-0 starts and ends both never decrease (FSDP2's Shard(0))."""
    from accel_parallel.checkpoint._planners import _ordered

    return _ordered([c.offsets[0] for c in chunks]) and _ordered(
        [c.offsets[0] + c.sizes[0] for c in chunks]
    )


def write_index(folder: Path, metadata: Metadata, storage: dict[Any, Any], fsync: bool) -> None:
    """Write `folder`'s chunk index from the metadata the coordinator made and the storage
    entries the ranks returned (their file, offset, length); once, on the coordinator."""
    keys: dict[str, Any] = {}
    tables: list[bytes] = []
    at = 0
    for fqn, md in metadata.state_dict_metadata.items():
        chunks = getattr(md, "chunks", None)
        infos = None
        if chunks is not None and len(chunks) > WHOLE_UP_TO and len(md.size) > 0:
            infos = [storage[MetadataIndex(fqn, c.offsets)] for c in chunks]
        if (
            infos is None
            or any(i.transform_descriptors for i in infos)
            or not _ordered_along_0(chunks)
        ):  # kept whole: a value stored once, or chunks in another order
            entries = {k: v for k, v in _entries_of(fqn, md, storage)}
            keys[fqn] = ("whole", md, entries)
            continue
        width = max(len(i.relative_path.encode()) for i in infos)
        row = _row_format(len(md.size), width)
        table = b"".join(
            row.pack(*c.offsets, *c.sizes, i.offset, i.length, i.relative_path.encode())
            for c, i in zip(chunks, infos)
        )
        keys[fqn] = ("rows", md.properties, md.size, len(chunks), at, width)
        tables.append(table)
        at += len(table)
    header = pickle.dumps(
        {
            "version": getattr(metadata, "version", None),
            "planner_data": metadata.planner_data,
            "keys": keys,
        }
    )
    tmp = folder / f"{DCP_INDEX}.tmp"
    with open(tmp, "wb") as f:
        f.write(_PREFIX.pack(MAGIC, len(header)))
        f.write(header)
        for table in tables:
            f.write(table)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, folder / DCP_INDEX)


def _entries_of(fqn: str, md: Any, storage: dict[Any, Any]) -> list[tuple[Any, Any]]:
    chunks = getattr(md, "chunks", None)
    if chunks is None:  # bytes
        index = MetadataIndex(fqn)
        return [(index, storage[index])]
    return [(MetadataIndex(fqn, c.offsets), storage[MetadataIndex(fqn, c.offsets)]) for c in chunks]


class IndexedWriter(dcp.FileSystemWriter):
    """torch's FileSystemWriter that also writes accel's chunk index on the coordinator."""

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        super().finish(metadata, results)
        storage = {r.index: r.storage_data for rs in results for r in rs}
        write_index(Path(self.path), metadata, storage, fsync=bool(self.sync_files))


class IndexedReader(dcp.FileSystemReader):
    """torch's FileSystemReader whose metadata holds only what `state` (laid out as this
    process holds it) needs, from the folder's chunk index when it has one."""

    def __init__(self, path: str | os.PathLike[str], state: dict[str, Any]) -> None:
        super().__init__(path)
        self._wanted = wanted_chunks(state)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        index = Path(self.path) / DCP_INDEX
        if kwargs.get("rank") is not None or not index.is_file():
            return super().read_metadata(*args, **kwargs)
        metadata = read_index(index, self._wanted)
        metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def wanted_chunks(state: dict[str, Any]) -> dict[str, list[Any] | None]:
    """{flattened key: the chunks this process loads}: a DTensor's local chunks ([] when this
    rank is not on its mesh), None (every chunk) for anything else."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.planner_helpers import _create_chunk_list
    from torch.distributed.tensor import DTensor

    flat, _ = flatten_state_dict(state)
    wanted: dict[str, list[Any] | None] = {}
    for key, value in flat.items():
        if isinstance(value, DTensor):
            on_mesh = value.device_mesh.get_coordinate() is not None
            wanted[key] = _create_chunk_list(value) if on_mesh else []
        else:
            wanted[key] = None
    return wanted


def read_index(path: Path, wanted: dict[str, list[Any] | None]) -> Metadata:
    """The Metadata of the keys in `wanted`, each with the saved chunks that its wanted
    chunks overlap along dim 0 (all of them for None), in the saved order."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        magic, length = _PREFIX.unpack_from(view, 0)
        if magic != MAGIC:
            raise ValueError(f"{path} is not an accel chunk index (starts with {magic!r})")
        header = pickle.loads(view[_PREFIX.size : _PREFIX.size + length])
        base = _PREFIX.size + length
        state_md: dict[str, Any] = {}
        storage: dict[Any, Any] = {}
        for key, chunks in wanted.items():
            entry = header["keys"].get(key)
            if entry is None:
                continue  # the planner says the key is missing, as torch's does
            if entry[0] == "whole":
                state_md[key] = entry[1]
                storage.update(entry[2])
                continue
            _, properties, size, n, at, width = entry
            rows = _Rows(view, base + at, n, len(size), width)
            picked = rows.overlapping(chunks)
            found = []
            for i in picked:
                offsets, sizes, info = rows.row(i)
                chunk = _chunk(offsets, sizes)
                found.append(chunk)
                storage[MetadataIndex(key, chunk.offsets)] = info
            state_md[key] = TensorStorageMetadata(properties=properties, size=size, chunks=found)
    metadata = Metadata(state_md, planner_data=header["planner_data"], storage_data=storage)
    if header["version"] is not None:
        metadata.version = header["version"]
    return metadata


def _chunk(offsets: tuple, sizes: tuple) -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


class _Rows:
    """The table of one key: `n` rows in order along dim 0, read as needed."""

    def __init__(self, view: mmap.mmap, at: int, n: int, ndim: int, width: int) -> None:
        self.view, self.at, self.n, self.ndim = view, at, n, ndim
        self.format = _row_format(ndim, width)

    def _values(self, i: int) -> tuple:
        return self.format.unpack_from(self.view, self.at + i * self.format.size)

    def row(self, i: int) -> tuple[tuple, tuple, Any]:
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        v = self._values(i)
        d = self.ndim
        name = v[2 * d + 2].rstrip(b"\0").decode()
        return v[:d], v[d : 2 * d], _StorageInfo(name, v[2 * d], v[2 * d + 1])

    def start(self, i: int) -> int:
        return self._values(i)[0]

    def end(self, i: int) -> int:
        v = self._values(i)
        return v[0] + v[self.ndim]

    def overlapping(self, chunks: list[Any] | None) -> list[int]:
        """Rows whose dim-0 span overlaps one of `chunks` as torch's pair test counts it
        (saved end > start and saved start < end); every row for None."""
        if chunks is None:
            return list(range(self.n))
        picked: set[int] = set()
        ends = _Lazy(self.n, self.end)
        starts = _Lazy(self.n, self.start)
        for c in chunks:
            lo, hi = c.offsets[0], c.offsets[0] + c.sizes[0]
            picked.update(range(bisect.bisect_right(ends, lo), bisect.bisect_left(starts, hi)))
        return sorted(picked)


class _Lazy:
    """A read-only sequence of `n` values computed on access (for bisect)."""

    def __init__(self, n: int, get: Any) -> None:
        self.n, self.get = n, get

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return self.get(i)
