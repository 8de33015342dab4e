"""The concurrent checkpoint reader: bitwise equal to safetensors, bounded, ordered, strict."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from accel_bigmodel import (
    CheckpointReader,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    load_offload_index,
)
from accel_bigmodel._fault_in import is_cached, map_file
from accel_bigmodel._header import read_header
from accel_bigmodel._placer import Placer
from accel_bigmodel._pread import ReadRequest, ReadStats, stream_tensors
from accel_bigmodel._read_ahead import warm_page_cache

CPU = torch.device("cpu")


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_bitwise(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        got = actual[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(_bits(got), _bits(want)), name


class Mixed(nn.Module):
    """One tensor of each dtype the reader must copy bit for bit, including NaN and inf."""

    def __init__(self) -> None:
        super().__init__()
        self.f32 = nn.Parameter(torch.randn(33, 7))
        self.f16 = nn.Parameter(torch.randn(5, 3).half())
        self.bf16 = nn.Parameter(torch.randn(64).bfloat16())
        self.register_buffer("i64", torch.arange(-20, 20, dtype=torch.int64).reshape(4, 10))
        self.register_buffer("mask", torch.rand(17) > 0.5)
        self.register_buffer("scalar", torch.tensor(3.5))
        self.register_buffer("empty", torch.zeros(0, 4))
        with torch.no_grad():
            self.f32[0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
            self.f16[0, 0] = float("nan")


def mixed_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in Mixed().state_dict().items()}


def empty_mixed() -> Mixed:
    with init_empty_weights():
        return Mixed()


def test_loads_every_dtype_bitwise_equal_to_safetensors(tmp_path):
    path = str(tmp_path / "model.safetensors")
    save_file(mixed_state(), path)
    model = empty_mixed()
    reader = CheckpointReader(backend="accel", map_cached=False)
    result = load_checkpoint_in_model(model, path, reader=reader, strict=True)
    assert result == ([], [])
    assert_bitwise(model.state_dict(), load_file(path))
    assert isinstance(model.f16, nn.Parameter) and model.f16.requires_grad


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache residency is Linux's")
def test_a_cached_file_is_mapped_not_copied_and_still_saves(tmp_path):
    path = str(tmp_path / "model.safetensors")
    save_file(mixed_state(), path)  # just written: every page is in the page cache
    model = empty_mixed()
    load_checkpoint_in_model(model, path, reader="accel", strict=True)
    assert_bitwise(model.state_dict(), load_file(path))
    with open("/proc/self/maps") as f:
        maps = [line.split() for line in f if line.rstrip().endswith(path)]
    spans = [tuple(int(x, 16) for x in m[0].split("-")) for m in maps]
    assert any(a <= model.f32.data_ptr() < b for a, b in spans)
    assert model.f32.untyped_storage().nbytes() == model.f32.nbytes  # its own storage
    save_file(model.state_dict(), str(tmp_path / "again.safetensors"))  # no shared memory


@pytest.mark.parametrize("shards", [1, 3])
def test_shards_and_tied_weights_match_the_mmap_reader(kit, reference, ids, tmp_path, shards):
    path = kit.write_checkpoint(reference, str(tmp_path), "safetensors", shards)
    ours = kit.TinyLM
    with init_empty_weights():
        fast, slow = ours().eval(), ours().eval()
    reader = CheckpointReader(threads=3, buffer_size="1MiB", map_cached=False)
    load_checkpoint_in_model(fast, path, reader=reader)
    load_checkpoint_in_model(slow, path, reader="mmap")
    assert fast.head.weight is fast.embed.weight
    assert_bitwise(fast.state_dict(), slow.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), reference(ids), rtol=0, atol=0)


def test_dtype_conversion_goes_through_staging_and_matches_a_cast(tmp_path):
    path = str(tmp_path / "model.safetensors")
    state = mixed_state()
    state["big"] = torch.randn(3 * 2**20 // 4 + 5)  # spans several 1 MiB staging chunks
    save_file(state, path)
    infos = {i.name: i for i in read_header(path)}
    requests = [ReadRequest(infos[n], torch.float16, CPU) for n in ("big", "f32", "bf16")]
    stats = ReadStats()
    got = {r.info.name: t for r, t in stream_tensors(requests, 2, 4 * 2**20, stats)}
    for name in got:
        assert torch.equal(_bits(got[name]), _bits(state[name].half())), name
    assert 0 < stats.staging_bytes <= 4 * 2**20


class KeptAndCast(nn.Module):
    """Tensors of odd sizes that share pages: `keep` stays fp32 (views of the shard's map),
    `cast` is read and converted into new memory."""

    def __init__(self) -> None:
        super().__init__()
        self.keep, self.cast = nn.Module(), nn.Module()
        for i in range(6):
            self.keep.register_parameter(f"w{i}", nn.Parameter(torch.randn(1000 + 37 * i)))
            self.cast.register_parameter(f"w{i}", nn.Parameter(torch.randn(3000 + 101 * i)))


@pytest.mark.parametrize("cold", [False, True])
def test_kept_views_and_converted_neighbours_sharing_pages_load_exactly(tmp_path, cold):
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in KeptAndCast().state_dict().items()}
    path = str(tmp_path / "model.safetensors")
    save_file(dict(sorted(state.items(), key=lambda kv: kv[0][-1])), path)  # interleaved
    if cold:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    with init_empty_weights():
        model = KeptAndCast()
    load_checkpoint_in_model(model, path, dtype=torch.float16, keep_in_fp32_modules=["keep"])
    for name, tensor in model.state_dict().items():
        want = state[name] if name.startswith("keep") else state[name].half()
        assert torch.equal(_bits(tensor), _bits(want)), name
    with torch.no_grad():  # the kept views are writable copies-on-write of the map
        model.keep.w0.add_(1)
    assert torch.equal(model.keep.w0, state["keep.w0"] + 1)
    assert torch.equal(model.keep.w1, state["keep.w1"])


def test_a_file_larger_than_the_buffer_is_read_within_it_in_the_order_asked(tmp_path):
    path = str(tmp_path / "model.safetensors")
    torch.manual_seed(0)
    state = {f"t{i:02d}": torch.randn(64 * 1024) for i in range(32)}  # 32 x 256 KiB = 8 MiB
    state["huge"] = torch.randn(3 * 2**20 // 4)  # one tensor of 3 MiB, larger than the buffer
    save_file(state, path)
    infos = {i.name: i for i in read_header(path)}
    wanted = [
        "huge",
        *sorted((n for n in state if n != "huge"), reverse=True),
    ]  # not the file's order
    stats = ReadStats()
    requests = [ReadRequest(infos[n], infos[n].dtype, CPU) for n in wanted]
    got = dict((r.info.name, t) for r, t in stream_tensors(requests, 4, 2**20, stats))
    assert stats.order == wanted
    assert_bitwise(got, load_file(path))
    assert stats.bytes_read == sum(i.nbytes for i in infos.values())
    # the huge tensor is read alone; after it, at most 1 MiB is allocated ahead of the consumer
    assert stats.peak_ahead_bytes == 3 * 2**20


def test_reads_in_the_models_order_not_the_files(kit, reference, tmp_path, monkeypatch):
    path = kit.write_checkpoint(reference, str(tmp_path), "safetensors", 2)
    placed = []
    real_put = Placer.put
    monkeypatch.setattr(
        Placer, "put", lambda self, n, p, v: (placed.append(n), real_put(self, n, p, v))
    )
    with init_empty_weights():
        model = kit.TinyLM()
    load_checkpoint_in_model(model, path, reader=CheckpointReader(map_cached=False))
    order = [n for n in model.state_dict() if n in placed]
    assert placed == order and placed.index("embed.weight") < placed.index(
        "body.layers.3.mlp.2.bias"
    )
    first = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[0]
    stored = [i.name for i in read_header(os.path.join(path, first))]  # the file's own order
    assert stored[0] == "body.layers.0.mlp.0.bias" and placed[:2] == ["pos", "embed.weight"]


def test_truncated_file_names_the_file_and_the_offset(tmp_path):
    path = str(tmp_path / "model.safetensors")
    save_file(mixed_state(), path)
    size = os.path.getsize(path)
    infos = read_header(path)
    with open(path, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(ValueError, match=rf"model.safetensors at byte {size - 10}: .*truncated"):
        load_checkpoint_in_model(empty_mixed(), path, reader="accel")
    # a file that shrinks after its header was read: the read itself reports where it stopped
    last = max(infos, key=lambda i: i.offset)
    requests = [ReadRequest(i, i.dtype, CPU) for i in infos]
    with pytest.raises(ValueError, match=rf"model.safetensors at byte {size - 10}: the file ended"):
        list(stream_tensors(requests, 2, 2**20))
    assert last.offset + last.nbytes == size


def test_corrupt_headers_are_explained(tmp_path):
    path = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    with pytest.raises(
        ValueError, match=r"model.safetensors at byte \d+: 'w' spans 8 bytes, not 16"
    ):
        read_header(str(path))
    path.write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="at byte 0: the header length 1000000 does not fit"):
        read_header(str(path))
    path.write_bytes((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(ValueError, match="at byte 8: the JSON header does not parse"):
        read_header(str(path))


def test_memory_stays_within_the_model_and_the_buffer(tmp_path):
    """Loading 64 MB of fp32 as fp16 with an 8 MiB buffer grows RSS by ~32 MB, not 64 + 32."""
    path = str(tmp_path / "model.safetensors")
    save_file({f"w{i}": torch.ones(2**20) for i in range(16)}, path)
    code = textwrap.dedent(f"""
        import torch
        from torch import nn
        from accel_bigmodel import CheckpointReader, init_empty_weights, load_checkpoint_in_model

        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                for i in range(16):
                    self.register_parameter(f"w{{i}}", nn.Parameter(torch.empty(2**20)))

        with init_empty_weights():
            model = M()
        torch.ones(1).half()  # warm up what the first cast allocates
        before = hwm()
        load_checkpoint_in_model(model, {path!r}, dtype=torch.float16, reader=READER)
        print(hwm() - before)
    """)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}

    def growth(reader: object) -> int:
        script = code.replace("READER", repr(reader))
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env
        )
        assert run.returncode == 0, run.stderr
        return int(run.stdout.split()[-1])

    model, buffer = 32 * 2**20, 8 * 2**20
    ours = growth(CheckpointReader(buffer_size=buffer, map_cached=False))
    assert ours <= model + buffer + 6 * 2**20, ours / 2**20
    auto = growth(CheckpointReader(buffer_size=buffer))  # the default reader, shards mapped
    assert auto <= model + buffer + 6 * 2**20, auto / 2**20


def test_disk_spill_with_a_dtype_change_writes_converted_tensors(kit, reference, ids, tmp_path):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors", 2)
    with init_empty_weights():
        model = kit.TinyLM().eval()
    device_map = {"embed": "cpu", "pos": "cpu", "body": "disk", "head": "cpu"}
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        model, path, device_map, offload_folder=offload, dtype="float16",
        reader=CheckpointReader(backend="accel", buffer_size="1MiB", threads=2, map_cached=False),
    )  # fmt: skip
    entry = load_offload_index(offload)["body.layers.1.mlp.2.weight"]
    assert entry["dtype"] == "float16" and "file" not in entry  # <name>.dat, as accelerate
    half = kit.make_reference().half()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), half.float()(ids).half(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("reader", "error", "match"),
    [
        ("fast", ValueError, r"Unknown checkpoint reader 'fast'; choose one of \['auto', 'accel'"),
        (3, ValueError, r"reader=3 is neither a backend name nor a CheckpointReader"),
    ],
)
def test_bad_reader_values_are_named(kit, reference, tmp_path, reader, error, match):
    path = kit.write_checkpoint(reference, str(tmp_path), "safetensors")
    with pytest.raises(error, match=match):
        load_checkpoint_in_model(empty_mixed(), path, reader=reader)


def test_bad_reader_settings_are_named(kit, reference, tmp_path):
    with pytest.raises(ValueError, match=r"threads=0 must be >= 1"):
        CheckpointReader(threads=0)
    with pytest.raises(ValueError, match=r"Cannot parse the memory size 'lots'"):
        CheckpointReader(buffer_size="lots")
    with pytest.raises(ValueError, match=r"buffer_size=1000 is below 1MiB"):
        CheckpointReader(buffer_size=1000)
    with pytest.raises(ValueError, match=r"backend='mmap'\) cannot honour threads=4"):
        CheckpointReader(backend="mmap", threads=4)
    with pytest.raises(ValueError, match=r"'fastsafetensors'\) cannot honour buffer_size='64MiB'"):
        CheckpointReader(backend="fastsafetensors", buffer_size="64MiB", threads=2)
    with pytest.raises(ValueError, match=r"'runai'\) cannot honour map_cached=False"):
        CheckpointReader(backend="runai", map_cached=False)
    folder = kit.write_checkpoint(reference, str(tmp_path), "bin")
    with pytest.raises(
        ValueError, match=r"reader='accel' reads safetensors files, .*pytorch_model.bin"
    ):
        load_checkpoint_in_model(empty_mixed(), folder, reader="accel")


@pytest.mark.parametrize(
    ("backend", "package"),
    [("runai", "runai_model_streamer"), ("fastsafetensors", "fastsafetensors")],
)
def test_optional_streamers_load_the_same_or_name_their_package(
    kit, reference, tmp_path, backend, package
):
    path = kit.write_checkpoint(reference, str(tmp_path), "safetensors", 2)
    with init_empty_weights():
        model = kit.TinyLM()
    try:
        __import__(package)
    except ImportError:
        install = {"runai": "runai-model-streamer", "fastsafetensors": "fastsafetensors"}[backend]
        with pytest.raises(ImportError, match=rf"pip install {install}"):
            load_checkpoint_in_model(model, path, reader=backend)
        return
    load_checkpoint_in_model(model, path, reader=backend, strict=True)
    assert model.head.weight is model.embed.weight
    assert_bitwise(model.state_dict(), reference.state_dict())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_cuda_target_streams_through_pinned_staging(tmp_path, dtype):
    path = str(tmp_path / "model.safetensors")
    state = mixed_state()
    state["big"] = torch.randn(3 * 2**20 // 4 + 5)
    save_file(state, path)
    infos = {i.name: i for i in read_header(path)}
    cuda = torch.device("cuda", 0)
    requests = [
        ReadRequest(i, dtype if dtype and i.dtype.is_floating_point else i.dtype, cuda)
        for i in infos.values()
    ]
    stats = ReadStats()
    got = {r.info.name: t for r, t in stream_tensors(requests, 3, 4 * 2**20, stats)}
    assert all(t.device == cuda for t in got.values())
    assert stats.peak_ahead_bytes == 0 and 0 < stats.staging_bytes <= 4 * 2**20
    for name, tensor in got.items():
        want = state[name].to(cuda).to(tensor.dtype).cpu()  # NaN bits follow the GPU's cast
        assert torch.equal(_bits(tensor.cpu()), _bits(want)), name
    model = empty_mixed()
    result = load_checkpoint_in_model(model, path, device_map={"": 0}, dtype=dtype)
    assert result.unexpected_keys == ["big"]
    assert model.f32.device == cuda and model.i64.dtype == torch.int64


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise to evict")
def test_warm_page_cache_reads_the_ranges_into_the_cache_in_parallel(tmp_path):
    paths = []
    for i in range(2):
        path = tmp_path / f"shard{i}.bin"
        path.write_bytes(os.urandom(20 * 2**20 + 12345))  # several 8 MiB reads, a ragged end
        paths.append(str(path))
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    maps = [map_file(p) for p in paths]
    if all(is_cached(m) for m in maps):
        pytest.skip("this filesystem keeps the pages cached whatever is asked")
    ranges = [(p, 0, os.path.getsize(p)) for p in paths]
    assert warm_page_cache(ranges, cached=set(paths)) == []  # the load found them cached
    workers = warm_page_cache([(p, 0, os.path.getsize(p)) for p in paths], threads=3)
    assert len(workers) == 3
    for worker in workers:
        worker.join(timeout=60)
    assert all(is_cached(m, samples=10_000, window=1) for m in maps)
    assert warm_page_cache([(p, 0, os.path.getsize(p)) for p in paths]) == []  # cached: skipped
    assert warm_page_cache([]) == []
