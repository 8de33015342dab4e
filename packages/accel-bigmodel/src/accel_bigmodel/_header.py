"""The one safetensors header parser (the reader, offload indexes, `accel estimate-memory`).

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets
relative to the end of the header) and the raw little-endian bytes. `read_safetensors_header`
parses it and checks every entry against the file (no tensor byte is read); it keeps dtypes as
safetensors spells them, so a dtype this torch lacks is still described. `read_header` is the
reader's view of the same: torch dtypes, and `UnsupportedDtype` for a dtype torch cannot hold.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable
from typing import NamedTuple

import torch

from accel_bigmodel import _store

_MAX_HEADER = 100 * 2**20  # safetensors' own limit
_FIRST_READ = 64 * 2**10  # a store object's first ranged read (the length and most headers)

# Bits per element of every dtype safetensors writes, to check each entry's byte span.
_BITS = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ"), 8),
    **dict.fromkeys(("F8_E5M2FNUZ", "F8_E8M0"), 8),
    **dict.fromkeys(("I16", "U16", "F16", "BF16"), 16),
    **dict.fromkeys(("I32", "U32", "F32"), 32),
    **dict.fromkeys(("I64", "U64", "F64", "C64"), 64),
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

# The dtypes read as torch tensors (by the reader, and pointed at in place by offload indexes).
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
for _name, _attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if isinstance(getattr(torch, _attr, None), torch.dtype):
        DTYPES[_name] = getattr(torch, _attr)


class StoredTensor(NamedTuple):
    """One tensor as a safetensors header describes it (`offset` from the file's start)."""

    name: str
    dtype: str  # safetensors' spelling: "F32", "BF16", ...
    shape: tuple[int, ...]
    offset: int
    nbytes: int


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


def corrupt_at(path: str, offset: int, what: str) -> ValueError:
    """The error for a shard that cannot be read: the file, the byte, what is wrong, the fix."""
    return ValueError(
        f"Cannot read the checkpoint shard {path} at byte {offset}: {what}. The file is "
        f"corrupt or truncated; save or download it again."
    )


def read_safetensors_header(path: str | os.PathLike) -> list[StoredTensor]:
    """The tensors of the safetensors file `path`, in the header's order; no tensor is read.

    Each entry is checked against the file: a well-formed dtype, shape and data_offsets, a
    byte span that matches the shape (for the dtypes safetensors knows) and lies inside the
    file. A bad header or a truncated file raises a `ValueError` naming the file and the byte.
    Dtypes are kept as safetensors spells them ("F32", "BF16", "F8_E4M3", ...).
    """
    path = os.fspath(path)
    if _store.is_url(path):  # an object in a store: ranged reads, no tensor byte
        return parse_safetensors_header(path, *_store_header_parts(path))
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        return parse_safetensors_header(path, size, f.read(8), f.read)


def _store_header_parts(url: str) -> tuple[int, bytes, Callable[[int], bytes]]:
    """(size, first bytes, read) of the safetensors object `url` for `parse_safetensors_header`:
    one ranged read of its first bytes, which hold the header of most files; a longer header
    is read with a second ranged read."""
    size = _store.size(url)
    raw = _store.read_bytes(url, 0, min(size, _FIRST_READ))

    def read(length: int) -> bytes:
        if 8 + length <= len(raw):
            return raw[8 : 8 + length]
        return raw[8:] + _store.read_bytes(url, len(raw), 8 + length)

    return size, raw, read


def parse_safetensors_header(
    path: str, size: int, raw: bytes, read: Callable[[int], bytes]
) -> list[StoredTensor]:
    """`read_safetensors_header` of a file of `size` bytes whose first bytes are `raw` (at least
    8 unless the file is shorter), `read(n)` giving the n bytes after the first 8."""
    if len(raw) < 8:
        raise corrupt_at(path, len(raw), f"the file has {size} bytes, fewer than the 8 of a header")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > min(_MAX_HEADER, size - 8):
        raise corrupt_at(path, 0, f"the header length {length} does not fit in {size} bytes")
    try:
        header = json.loads(read(length))
    except (ValueError, UnicodeDecodeError) as e:
        raise corrupt_at(path, 8, f"the JSON header does not parse ({e})") from None
    if not isinstance(header, dict):
        raise corrupt_at(path, 8, "the JSON header is not an object")
    header.pop("__metadata__", None)
    start, end_of_data = 8 + length, size - 8 - length
    tensors = []
    for name, entry in header.items():
        try:
            kind, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            numel = 1
            for dim in shape:
                if not isinstance(dim, int) or dim < 0:
                    raise TypeError(dim)
                numel *= dim
            if not isinstance(kind, str):
                raise TypeError(kind)
        except (KeyError, TypeError, ValueError):
            raise corrupt_at(path, 8, f"the entry of {name!r} is malformed: {entry!r}") from None
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise corrupt_at(path, 8, f"{name!r} has invalid data_offsets {[begin, end]}")
        if kind in _BITS and end - begin != -(-numel * _BITS[kind] // 8):
            nbytes = -(-numel * _BITS[kind] // 8)
            raise corrupt_at(
                path, start + begin, f"{name!r} spans {end - begin} bytes, not {nbytes}"
            )
        if end > end_of_data:
            raise corrupt_at(
                path, size, f"{name!r} needs bytes {start + begin}..{start + end} but the file ends"
            )
        tensors.append(StoredTensor(name, kind, shape, start + begin, end - begin))
    return tensors


def read_header(path: str) -> list[TensorInfo]:
    """The tensors of the safetensors file `path` with torch dtypes, checked against the file.

    Raises `UnsupportedDtype` when a tensor's dtype is one this torch cannot hold.
    """
    infos = []
    for t in read_safetensors_header(path):
        if t.dtype not in DTYPES:
            raise UnsupportedDtype(
                f"{path}: tensor {t.name!r} has dtype {t.dtype!r}, which torch {torch.__version__} "
                f"cannot hold (known: {sorted(DTYPES)}). Use reader='mmap' or convert it."
            )
        infos.append(TensorInfo(t.name, path, t.offset, t.nbytes, DTYPES[t.dtype], t.shape))
    return infos


def reads_natively() -> bool:
    """Raw bytes become tensors without swapping: safetensors files are little-endian."""
    return sys.byteorder == "little"
