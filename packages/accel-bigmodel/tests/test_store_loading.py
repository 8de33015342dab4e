"""Loading checkpoints from an object store (s3:// URLs) against a real S3 server (moto's, on
loopback): every tensor loaded from the URL equals the one loaded from the local copy, the
store is read with ranged reads, and failures name the URL and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_bigmodel import (
    OffloadedWeightsLoader,
    checkpoint_files,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    save_sharded_weights,
    stores,
)
from accel_bigmodel import _store as store_module
from accel_bigmodel import _store_load as store_load
from accel_bigmodel._header import TensorInfo, read_safetensors_header
from accel_bigmodel._store_load import plan_reads, stream_ranges

pytestmark = pytest.mark.needs("s3fs", "moto")

DIM, VOCAB, BLOCKS = 32, 48, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, 2 * DIM)
        self.out = nn.Linear(2 * DIM, DIM).to(torch.bfloat16)  # mixed dtypes
        self.register_buffer("steps", torch.zeros(DIM, dtype=torch.int64))
        self.register_buffer("mask", torch.zeros(DIM, dtype=torch.bool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x.to(self.fc.weight.dtype))).to(self.out.weight.dtype)
        return x + self.out(h).to(x.dtype) * self.mask + self.steps.to(x.dtype) * 1e-3


class Net(nn.Module):
    def __init__(self, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: stored once

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x.to(self.head.weight.dtype))


def _reference() -> Net:
    torch.manual_seed(0)
    net = Net()
    for i, block in enumerate(net.blocks):
        block.steps.copy_(torch.arange(DIM) * (i + 1))
        block.mask.copy_(torch.arange(DIM) % (i + 2) == 0)
    return net


def _empty(blocks: int = BLOCKS) -> Net:
    with init_empty_weights():
        return Net(blocks)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local folder: single/ (model.safetensors), sharded/ (shards + index), bin/ (torch)."""
    root = tmp_path_factory.mktemp("ckpt")
    state = _reference().state_dict()
    save_sharded_weights(state, root / "single")
    save_sharded_weights(state, root / "sharded", max_shard_size="12KB")
    save_sharded_weights(state, root / "bin", safe_serialization=False)
    assert len(list((root / "sharded").glob("*.safetensors"))) >= 3
    return root


@pytest.fixture
def uploaded(s3: str, saved: Path) -> str:
    url = stores.join(s3, "ckpt")
    stores.upload(saved, url)
    return url


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize(
    "where",
    ["single/model.safetensors", "single", "sharded/model.safetensors.index.json", "sharded"],
)
def test_a_url_loads_what_the_local_path_loads(uploaded: str, saved: Path, where: str):
    from_store, from_disk = _empty(), _empty()
    url = stores.join(uploaded, where)
    got = load_checkpoint_in_model(from_store, url, strict=True, show_progress=False)
    load_checkpoint_in_model(from_disk, saved / where, strict=True, show_progress=False)
    assert got.missing_keys == [] and got.unexpected_keys == []
    _assert_same(from_store, from_disk)
    _assert_same(from_store, _reference())
    assert from_store.head.weight is from_store.embed.weight
    local = [Path(f).name for f in checkpoint_files(saved / where)]
    assert [stores.name_of(f) for f in checkpoint_files(url)] == local
    assert not Path("s3:").exists()


def test_a_torch_bin_url_is_read_whole_and_loads_the_same(uploaded: str, saved: Path):
    from_store, from_disk = _empty(), _empty()
    load_checkpoint_in_model(from_store, stores.join(uploaded, "bin"), show_progress=False)
    load_checkpoint_in_model(from_disk, saved / "bin", show_progress=False)
    _assert_same(from_store, from_disk)


def test_dispatch_auto_with_cpu_and_disk_offload_and_dtype(
    uploaded: str, saved: Path, tmp_path: Path
):
    ids = torch.arange(12).reshape(2, 6) % VOCAB
    models = {}
    for where, source in (("store", stores.join(uploaded, "sharded")), ("disk", saved / "sharded")):
        models[where] = load_checkpoint_and_dispatch(
            _empty(), source, device_map="auto", max_memory={"cpu": 30_000},
            no_split_module_classes=["Block"], offload_folder=tmp_path / where,
            dtype=torch.float16, show_progress=False,
        )  # fmt: skip
    store, disk = models["store"], models["disk"]
    assert store.hf_device_map == disk.hf_device_map
    assert {"cpu", "disk"} <= set(store.hf_device_map.values()), store.hf_device_map
    on_disk = [k for k, v in store.hf_device_map.items() if v == "disk" and k.startswith("blocks")]
    loaders = {w: OffloadedWeightsLoader(save_folder=tmp_path / w) for w in models}
    checked = 0
    for name in loaders["disk"].index:
        if any(name.startswith(f"{m}.") for m in on_disk):
            a, b = loaders["store"][name], loaders["disk"][name]
            assert a.dtype == b.dtype and torch.equal(a, b), name
            checked += 1
    assert checked >= 4
    assert loaders["store"]["blocks.3.fc.weight"].dtype == torch.float16  # converted
    assert store.blocks[3].steps.dtype == torch.int64  # integers kept (buffers stay in memory)
    for name, tensor in disk.state_dict().items():
        if tensor.device.type != "meta":
            assert torch.equal(store.state_dict()[name], tensor), name
    with torch.no_grad():
        assert torch.equal(store(ids), disk(ids))


def test_dtype_conversion_and_keep_in_fp32(uploaded: str, saved: Path):
    from_store, from_disk = _empty(), _empty()
    for model, source in ((from_store, stores.join(uploaded, "sharded")), (from_disk, saved)):
        source = source if isinstance(source, str) else source / "sharded"
        load_checkpoint_in_model(
            model, source, dtype="float16", keep_in_fp32_modules=["out"], show_progress=False
        )
    _assert_same(from_store, from_disk)
    assert from_store.blocks[0].fc.weight.dtype == torch.float16
    assert from_store.blocks[0].out.weight.dtype == torch.float32
    assert from_store.blocks[0].steps.dtype == torch.int64


def test_the_store_is_read_with_ranged_reads_of_only_the_needed_bytes(
    uploaded: str, saved: Path, monkeypatch: pytest.MonkeyPatch
):
    """What the loader asks the store for, recorded by wrappers around the real reads (the
    bytes still come from the server): a ranged read for each header, then ranged reads of
    tensors; with a model of half the blocks, the other blocks' bytes are never asked for.
    (That each becomes one GET with a Range header is s3fs's part, and _store.read_into's.)"""
    reads: list[tuple[str, int | None, int | None]] = []
    read_bytes, read_into = store_module.read_bytes, store_module.read_into

    def recording_bytes(url: str, start: int | None = None, end: int | None = None) -> bytes:
        reads.append((url, start, end))
        return read_bytes(url, start, end)

    def recording_into(url: str, start: int, end: int, pieces: list) -> None:
        reads.append((url, start, end))
        read_into(url, start, end, pieces)

    monkeypatch.setattr(store_module, "read_bytes", recording_bytes)
    monkeypatch.setattr(store_module, "read_into", recording_into)
    url = stores.join(uploaded, "single", "model.safetensors")
    size = (saved / "single" / "model.safetensors").stat().st_size
    full = _empty()
    load_checkpoint_in_model(full, url, show_progress=False)
    assert reads and all(s is not None and e is not None for _, s, e in reads)
    assert reads[0][1:] == (0, min(size, 64 * 2**10))  # the header's ranged read
    assert not any((s, e) == (0, size) for _, s, e in reads[1:])  # no whole-object GET
    tensor_bytes = sum(e - s for _, s, e in reads[1:])
    assert tensor_bytes <= size  # nothing read twice
    reads.clear()
    monkeypatch.setattr(store_load, "_GAP", 0)  # no read runs on through a gap
    half = _empty(blocks=2)
    result = load_checkpoint_in_model(half, url, show_progress=False)
    assert result.unexpected_keys and all(k.startswith("blocks.") for k in result.unexpected_keys)
    kept = set(half.state_dict()) - {"head.weight"}  # (tied: stored as embed.weight)
    header = read_safetensors_header(saved / "single" / "model.safetensors")
    assert sum(e - s for _, s, e in reads[1:]) == sum(t.nbytes for t in header if t.name in kept)
    assert sum(t.nbytes for t in header) > 1.5 * sum(t.nbytes for t in header if t.name in kept)
    _assert_same(half.blocks[1], full.blocks[1])


def _info(name: str, offset: int, nbytes: int, path: str = "s3://b/x") -> TensorInfo:
    return TensorInfo(name, path, offset, nbytes, torch.uint8, (nbytes,))


def test_reads_coalesce_neighbours_split_large_tensors_and_stay_within_the_part():
    mib = 2**20
    infos = [
        _info("a", 100, 10),
        _info("b", 110, 20),  # adjacent: same read
        _info("c", 130 + 4 * mib, 10),  # far: a new read
        _info("d", 140 + 4 * mib, 5 * mib),  # over the part: split, first piece joins c's read
        _info("e", 140 + 9 * mib, 10),  # joins d's last piece
        _info("f", 0, 10, path="s3://b/y"),  # another object: a new read
    ]
    reads = plan_reads(infos, part=2 * mib)
    assert [(r.url, r.start, r.end) for r in reads] == [
        ("s3://b/x", 100, 130),
        ("s3://b/x", 130 + 4 * mib, 140 + 4 * mib),
        ("s3://b/x", 140 + 4 * mib, 140 + 6 * mib),
        ("s3://b/x", 140 + 6 * mib, 140 + 8 * mib),
        ("s3://b/x", 140 + 8 * mib, 150 + 9 * mib),
        ("s3://b/y", 0, 10),
    ]
    assert all(r.end - r.start <= 2 * mib for r in reads)
    assert [[p[0] for p in r.pieces] for r in reads] == [[0, 1], [2], [3], [3], [3, 4], [5]]


def test_stream_ranges_gives_each_tensors_bytes_in_order(s3: str):
    data = os.urandom(3 * 2**20 + 17)
    stores.write_bytes(stores.join(s3, "blob"), data)
    url = stores.join(s3, "blob")
    cuts = [(0, 0), (5, 1000), (1000, 1000), (2000, 2**20 + 3), (2**20 + 9, len(data))]
    infos = [_info(f"t{i}", a, b - a, url) for i, (a, b) in enumerate(cuts)]
    got = list(stream_ranges(infos, threads=3, budget=2**21, part=2**19))
    assert [bytes(t.numpy()) for t in got] == [data[a:b] for a, b in cuts]


def test_stream_ranges_reads_no_further_ahead_than_its_budget(
    s3: str, monkeypatch: pytest.MonkeyPatch
):
    """Tensors that count against the budget (1 MiB each, a 2 MiB budget): when tensor k is
    handed over, no read past tensor k + 2 has started. (Tensors that cost nothing, the
    model's own, are not held back; here only their bytes are checked.)"""
    mib = 2**20
    url = stores.join(s3, "blob")
    stores.write_bytes(url, os.urandom(8 * mib))
    infos = [_info(f"t{i}", i * mib, mib, url) for i in range(8)]
    started: list[int] = []
    read_into = store_module.read_into

    def recording(url: str, start: int, end: int, pieces: list) -> None:
        started.append(start)
        read_into(url, start, end, pieces)

    monkeypatch.setattr(store_module, "read_into", recording)
    monkeypatch.setattr(store_load, "_GAP", -1)  # one read per tensor
    for k, _ in enumerate(stream_ranges(infos, threads=2, budget=2 * mib, part=mib)):
        assert max(started) <= (k + 2) * mib, (k, started)
    free = stream_ranges(infos, threads=2, budget=2 * mib, part=mib, costs=[0] * 8)
    data = stores.read_bytes(url)
    assert [bytes(t.numpy()) for t in free] == [data[i * mib : (i + 1) * mib] for i in range(8)]


def test_errors_name_the_url_and_urls_never_become_local_folders(
    s3: str, uploaded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    missing = stores.join(uploaded, "nothing", "model.safetensors")
    with pytest.raises(FileNotFoundError, match=rf"Checkpoint '{missing}' is neither an object"):
        load_checkpoint_in_model(_empty(), missing)
    with pytest.raises(FileNotFoundError, match=r"bucket 'no-such-bucket' of s3://no-such"):
        load_checkpoint_in_model(_empty(), "s3://no-such-bucket/model")
    index = stores.read_bytes(stores.join(uploaded, "sharded", "model.safetensors.index.json"))
    bad = stores.join(s3, "bad")
    stores.write_bytes(stores.join(bad, "model.safetensors.index.json"), index)
    with pytest.raises(FileNotFoundError, match=rf"lists shard\(s\) that do not exist: \['{bad}/"):
        load_checkpoint_in_model(_empty(), bad)
    with pytest.raises(ValueError, match=r"reader='mmap' reads local files.*reader='auto'"):
        load_checkpoint_in_model(_empty(), stores.join(uploaded, "single"), reader="mmap")
    with pytest.raises(ValueError, match=r"is an object-store URL where only a local path"):
        load_checkpoint_and_dispatch(
            _empty(), stores.join(uploaded, "single"), device_map={"": "disk"},
            offload_folder=stores.join(s3, "offload"),
        )  # fmt: skip
    whole = stores.read_bytes(stores.join(uploaded, "single", "model.safetensors"))
    cut = stores.join(s3, "cut", "model.safetensors")
    stores.write_bytes(cut, whole[: len(whole) - 100])
    with pytest.raises(ValueError, match=rf"Cannot read the checkpoint shard {cut}"):
        load_checkpoint_in_model(_empty(), cut)
    assert list(tmp_path.iterdir()) == []  # no "s3:" folder, nothing written here


def test_an_endpoint_that_does_not_answer_is_named(uploaded: str, monkeypatch: pytest.MonkeyPatch):
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    s3fs.S3FileSystem.clear_instance_cache()  # (clients made under the server's address)
    try:
        with pytest.raises(stores.StoreError, match=r"the store for s3://.* does not answer"):
            load_checkpoint_in_model(_empty(), stores.join(uploaded, "single"))
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.needs("bitsandbytes")
def test_a_quantized_load_from_a_url_equals_the_local_one(uploaded: str, saved: Path):
    from accel_bigmodel.quantization import BnbQuantizationConfig, load_and_quantize_model

    config = BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32)
    from_store = load_and_quantize_model(_empty(), config, stores.join(uploaded, "sharded"))
    from_disk = load_and_quantize_model(_empty(), config, saved / "sharded")
    _assert_same(from_store, from_disk)
