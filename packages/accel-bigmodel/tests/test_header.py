"""The one safetensors header parser, as the reader, the offload index and the CLI see it."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from accel_bigmodel import read_safetensors_header
from accel_bigmodel._header import UnsupportedDtype, read_header
from accel_bigmodel._offload import safetensors_entries


def _write(path, entries: dict, data: bytes, metadata: dict | None = None) -> str:
    header = dict(entries, **({"__metadata__": metadata} if metadata else {}))
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return str(path)


def test_the_three_views_agree_on_a_real_file(tmp_path):
    path = str(tmp_path / "model.safetensors")
    state = {"b": torch.ones(3, 5, dtype=torch.bfloat16), "a": torch.zeros(7), "e": torch.ones(0)}
    save_file(state, path, metadata={"format": "pt"})
    stored = {t.name: t for t in read_safetensors_header(path)}
    assert sorted(stored) == ["a", "b", "e"]  # the metadata is not a tensor
    assert stored["b"].dtype == "BF16" and stored["b"].shape == (3, 5) and stored["b"].nbytes == 30
    infos = {i.name: i for i in read_header(path)}
    entries = safetensors_entries(path)
    with open(path, "rb") as f:
        data = f.read()
    for name, tensor in state.items():
        assert infos[name].offset == stored[name].offset == entries[name]["offset"]
        assert infos[name].dtype == tensor.dtype and entries[name]["dtype"] == str(tensor.dtype)[6:]
        raw = data[stored[name].offset : stored[name].offset + stored[name].nbytes]
        assert raw == tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert entries["a"]["file"] == os.path.abspath(path)


def test_a_dtype_torch_lacks_is_described_skipped_or_refused(tmp_path):
    entries = {
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "c": {"dtype": "C64", "shape": [1], "data_offsets": [8, 16]},
        "q": {"dtype": "F4", "shape": [3, 2], "data_offsets": [16, 19]},  # 4 bits each
        "x": {"dtype": "NEW_DTYPE", "shape": [5], "data_offsets": [19, 20]},  # size unknown
    }
    path = _write(tmp_path / "odd.safetensors", entries, b"\0" * 20)
    assert [(t.name, t.dtype, t.nbytes) for t in read_safetensors_header(path)] == [
        ("w", "F32", 8), ("c", "C64", 8), ("q", "F4", 3), ("x", "NEW_DTYPE", 1),
    ]  # fmt: skip
    assert list(safetensors_entries(path)) == ["w"]  # only what torch can map in place
    with pytest.raises(UnsupportedDtype, match="'c' has dtype 'C64'.*reader='mmap'"):
        read_header(path)


@pytest.mark.parametrize(
    ("entry", "data", "match"),
    [
        ({"dtype": "F16", "shape": [3], "data_offsets": [0, 4]}, 8, "'w' spans 4 bytes, not 6"),
        ({"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}, 8, "'w' spans 1 bytes, not 2"),
        (
            {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            8,
            "'w' needs bytes .* the file ends",
        ),
        (
            {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
            8,
            "the entry of 'w' is malformed",
        ),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, 8, "'w' has invalid data_offsets"),
        ({"shape": [1], "data_offsets": [0, 4]}, 8, "the entry of 'w' is malformed"),
    ],
)
def test_bad_entries_name_the_file_the_byte_and_the_fix(tmp_path, entry, data, match):
    path = _write(tmp_path / "bad.safetensors", {"w": entry}, b"\0" * data)
    for parse in (read_safetensors_header, read_header, safetensors_entries):
        with pytest.raises(ValueError, match=rf"bad.safetensors at byte \d+: {match}.*corrupt"):
            parse(path)


def test_short_and_garbled_files(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\1\0")
    with pytest.raises(ValueError, match="at byte 2: the file has 2 bytes, fewer than the 8"):
        read_safetensors_header(path)  # a PathLike is accepted
    path.write_bytes((4).to_bytes(8, "little") + b"[1] ")
    with pytest.raises(ValueError, match="at byte 8: the JSON header is not an object"):
        read_safetensors_header(path)
    with pytest.raises(FileNotFoundError):
        read_safetensors_header(tmp_path / "missing.safetensors")
