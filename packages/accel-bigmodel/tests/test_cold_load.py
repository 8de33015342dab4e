"""Cold loads: shards not in the page cache are mapped and faulted in by threads, in order.

A shard counts as cold when `is_cached` says so; the tests make that certain by patching it
(and by dropping the files' pages where the file system allows), so they do not depend on
what the page cache holds.
"""

import copy
import ctypes
import itertools
import json
import mmap
import os
import struct
import sys
import threading

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accel_bigmodel import (
    CheckpointReader,
    _fault_in,
    _sources,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from accel_bigmodel._fault_in import FaultIn, map_file
from accel_bigmodel._header import read_header

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="maps and page residency are Linux's"
)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _resident(mapped: mmap.mmap) -> list[int]:
    """Per page of `mapped`: 1 where it is in the page cache (mincore)."""
    pages = -(-len(mapped) // mmap.PAGESIZE)
    status = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mapped)
    try:
        size = ctypes.c_size_t(pages * mmap.PAGESIZE)
        assert not ctypes.CDLL(None).mincore(
            ctypes.c_void_p(ctypes.addressof(anchor)), size, status
        )
    finally:
        del anchor
    return list(status)


def _drop_pages(*paths: str) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.fixture
def cold(monkeypatch):
    """Every shard is treated as cold (not in the page cache)."""
    monkeypatch.setattr(_sources, "is_cached", lambda mapped: False)


def _in_a_map_of(tensor: torch.Tensor, path: str) -> bool:
    with open("/proc/self/maps") as f:
        spans = [
            tuple(int(x, 16) for x in line.split()[0].split("-"))
            for line in f
            if line.rstrip().endswith(path)
        ]
    return any(a <= tensor.data_ptr() < b for a, b in spans)


def _write_raw(path: str, entries: list[tuple[str, str, list[int], bytes]]) -> None:
    """A safetensors file with the data exactly as laid out here (offsets may be odd)."""
    header, data = {}, b""
    for name, dtype, shape, raw in entries:
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("flags", torch.zeros(3, dtype=torch.uint8))
        self.a = nn.Parameter(torch.zeros(1000))  # at an odd offset: read, not mapped
        self.b = nn.Parameter(torch.zeros(7, dtype=torch.float16))
        self.c = nn.Parameter(torch.zeros(3 * 2**20 // 4 + 3))  # 4-byte aligned: mapped
        self.register_buffer("i", torch.zeros(5, dtype=torch.int64))


def test_cold_shards_of_every_dtype_and_odd_offsets_load_bit_exact(tmp_path, cold):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000).astype("<f4")
    b = rng.standard_normal(7).astype("<f2")
    c = rng.standard_normal(3 * 2**20 // 4 + 3).astype("<f4")
    c[:3] = [np.nan, np.inf, -0.0]
    i = np.arange(-2, 3, dtype="<i8")
    odd = str(tmp_path / "odd.safetensors")
    _write_raw(odd, [("flags", "U8", [3], b"\x01\x02\x03"), ("a", "F32", [1000], a.tobytes()),
                     ("b", "F16", [7], b.tobytes()), ("extra", "U8", [1], b"\x00")])  # fmt: skip
    assert {i.name: i.offset % 4 for i in read_header(odd)}["a"] == 3
    rest = str(tmp_path / "rest.safetensors")
    save_file({"c": torch.from_numpy(c.copy()), "i": torch.from_numpy(i.copy())}, rest)
    index = {"weight_map": {"flags": "odd.safetensors", "a": "odd.safetensors",
                            "b": "odd.safetensors", "extra": "odd.safetensors",
                            "c": "rest.safetensors", "i": "rest.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _drop_pages(odd, rest)
    with torch.device("meta"):
        model = Odd()
    result = load_checkpoint_in_model(
        model, str(tmp_path), reader=CheckpointReader(threads=3, overlap=False)
    )
    assert result.unexpected_keys == ["extra"]
    want = {"a": a, "b": b, "c": c, "i": i}
    want = {k: torch.from_numpy(v) for k, v in want.items()}
    want["flags"] = torch.tensor([1, 2, 3], dtype=torch.uint8)
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == want[name].dtype and torch.equal(_bits(tensor), _bits(want[name]))
    assert _in_a_map_of(model.c, rest) and not _in_a_map_of(model.a, odd)
    assert all(not m._forward_pre_hooks for m in model.modules())  # overlap=False: no hooks
    save_file(model.state_dict(), str(tmp_path / "again.safetensors"))  # each its own storage


def test_fault_in_covers_every_tensor_in_runs_within_the_chunk(tmp_path):
    """Many small tensors share runs; big ones span several; all come in, in the order asked."""
    state = {f"s{k:03d}": torch.randn(k % 7 + 1) for k in range(300)}
    state["big"] = torch.randn(5 * mmap.PAGESIZE + 3)  # crosses several 2-page runs
    state["h"] = torch.randn(9).half()
    path = str(tmp_path / "many.safetensors")
    save_file(state, path)
    infos = sorted(read_header(path), key=lambda i: i.name, reverse=True)  # not the file's order
    mapped = map_file(path)
    items = [(path, mapped, i.offset, i.nbytes) for i in infos]
    chunk = 2 * mmap.PAGESIZE
    _drop_pages(path)
    fault_in = FaultIn(items, threads=1, chunk=chunk)
    fault_in.join()
    first = min(offset for _, _, offset, _ in items) // mmap.PAGESIZE  # the header's not asked
    assert all(_resident(mapped)[first:])  # read into the page cache, which the tensors view
    assert fault_in.order == list(range(len(items)))  # one thread: exactly the order asked
    covered: dict[int, list[tuple[int, int]]] = {}
    for _, begin, end, members in fault_in._jobs:
        assert 0 < end - begin <= chunk and begin % mmap.PAGESIZE == 0
        for m in members:
            covered.setdefault(m, []).append((begin, end))
    for k, (_, _, offset, nbytes) in enumerate(items):
        spans = sorted(covered[k])
        assert spans[0][0] <= offset and spans[-1][1] >= offset + nbytes, infos[k].name
        assert all(a[1] >= b[0] for a, b in itertools.pairwise(spans))
    assert len(fault_in._jobs) < len(items) // 2  # small neighbours share a run
    for k, info in enumerate(infos):
        fault_in.wait(k)
        got = torch.frombuffer(
            mapped,
            dtype=info.dtype,
            count=info.nbytes // info.dtype.itemsize,
            offset=info.offset,
        )
        assert torch.equal(_bits(got), _bits(state[info.name].reshape(-1))), info.name
    assert fault_in.finished


class Chain(nn.Module):
    def __init__(self, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_first_forward_runs_while_the_last_layer_is_still_being_read(tmp_path, cold, monkeypatch):
    torch.manual_seed(0)
    reference = Chain().eval()
    state = reference.state_dict()
    names = list(state)
    save_file({n: state[n] for n in names[:6]}, str(tmp_path / "model-1.safetensors"))
    save_file({n: state[n] for n in names[6:]}, str(tmp_path / "model-2.safetensors"))
    weight_map = {n: f"model-{1 if k < 6 else 2}.safetensors" for k, n in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    events: list[str] = []
    first_ran = threading.Event()
    take = FaultIn._take

    def gated_take(self):  # hold back the last layer's pages until the first layer has run
        job = take(self)
        if job is not None and len(self._remaining) - 1 in job[3]:
            first_ran.wait(timeout=10)
            events.append("last layer read")
        return job

    monkeypatch.setattr(FaultIn, "_take", gated_take)
    with torch.device("meta"):
        model = Chain().eval()
    model = load_checkpoint_and_dispatch(
        model, str(tmp_path), device_map={"": "cpu"}, reader=CheckpointReader(threads=1)
    )
    events.append("load returned")
    waits = [m for m in model.layers if m._forward_pre_hooks]
    assert len(waits) == len(model.layers)  # each layer waits for its own tensors
    copied = copy.deepcopy(model)  # meanwhile: a copy's hooks do not wait, its weights are whole
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(copied(x), reference(x))
    assert events == ["load returned"]

    def ran(module, args):
        events.append("first layer ran")
        first_ran.set()

    model.layers[0].register_forward_pre_hook(ran)
    with torch.no_grad():
        out = model(x)
        assert torch.equal(out, reference(x))
    assert events == ["load returned", "first layer ran", "last layer read"]
    assert [bool(m._forward_pre_hooks) for m in model.layers] == [True] + [False] * 5
    files = [str(tmp_path / f"model-{k}.safetensors") for k in (1, 2)]
    assert all(any(_in_a_map_of(p, f) for f in files) for p in model.parameters())


def test_overlap_option_is_checked():
    with pytest.raises(ValueError, match=r"overlap='no' must be a bool"):
        CheckpointReader(overlap="no")
    with pytest.raises(ValueError, match=r"'mmap'\) cannot honour overlap=False"):
        CheckpointReader(backend="mmap", overlap=False)


def test_a_reading_error_reaches_the_forward(tmp_path, cold, monkeypatch):
    path = str(tmp_path / "model.safetensors")
    torch.manual_seed(0)
    save_file(Chain(depth=2).state_dict(), path)

    def broken(*args):  # the disk fails under the reading threads
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_fault_in, "read_range", broken)
    with torch.device("meta"):
        model = Chain(depth=2)
    load_checkpoint_in_model(model, path)
    with pytest.raises(OSError, match="Reading checkpoint pages failed: .*Input/output error"):
        model(torch.randn(1, 64))
    with torch.device("meta"):
        model = Chain(depth=2)
    with pytest.raises(OSError, match="Reading checkpoint pages failed"):
        load_checkpoint_in_model(model, path, reader=CheckpointReader(overlap=False))
