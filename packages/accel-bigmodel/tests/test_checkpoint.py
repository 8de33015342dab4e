import io
import json
import logging
import os

import pytest
import torch

from accel_bigmodel import (
    checkpoint_files,
    init_empty_weights,
    load_checkpoint_in_model,
    load_offload_index,
)
from accel_bigmodel._progress import Progress


def empty(kit):
    with init_empty_weights():
        return kit.TinyLM().eval()


@pytest.mark.parametrize(
    ("fmt", "shards"), [("safetensors", 1), ("bin", 1), ("pt", 1), ("safetensors", 3), ("bin", 2)]
)
def test_load_into_empty_model_equals_the_original(kit, reference, ids, tmp_path, fmt, shards):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), fmt, shards)
    model = empty(kit)
    result = load_checkpoint_in_model(model, path, show_progress=False)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert model.head.weight is model.embed.weight  # the tie survives (stored once)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, reference.state_dict()[name], msg=name)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids))


def test_checkpoint_files_finds_index_single_file_and_explains_ambiguity(kit, reference, tmp_path):
    folder = kit.write_checkpoint(reference, str(tmp_path / "sharded"), "safetensors", 2)
    files = checkpoint_files(folder)
    assert [os.path.basename(f) for f in files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert checkpoint_files(os.path.join(folder, "model.safetensors.index.json")) == files
    kit.write_checkpoint(reference, str(tmp_path / "one"), "bin")
    assert checkpoint_files(tmp_path / "one") == [str(tmp_path / "one" / "pytorch_model.bin")]
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.pt").write_bytes(b"")
    (tmp_path / "two" / "b.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"Cannot tell which checkpoint .*'a.pt', 'b.pt'"):
        checkpoint_files(tmp_path / "two")
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    index["weight_map"]["extra"] = "model-00009-of-00009.safetensors"
    with open(tmp_path / "bad.index.json", "w") as f:
        json.dump(index, f)
    with pytest.raises(FileNotFoundError, match="model-00009-of-00009"):
        checkpoint_files(tmp_path / "bad.index.json")


def test_dtype_and_keep_in_fp32(kit, reference, ids, tmp_path):
    path = kit.write_checkpoint(reference, str(tmp_path), "safetensors")
    model = empty(kit)
    load_checkpoint_in_model(model, path, dtype="float16", keep_in_fp32_modules=["norm"])
    assert model.embed.weight.dtype == torch.float16 and model.pos.dtype == torch.float16
    assert model.body.layers[0].norm.weight.dtype == torch.float32
    torch.testing.assert_close(model.embed.weight, reference.embed.weight.half())


def test_missing_and_unexpected_keys_raise_when_strict_and_warn_otherwise(
    kit, reference, tmp_path, caplog
):
    from safetensors.torch import save_file

    state = kit.untied_state_dict(reference)
    del state["body.layers.2.mlp.0.bias"]
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"missing keys \['body.layers.2.mlp.0.bias'\].*\['extra.weight'\]"
    ):
        load_checkpoint_in_model(empty(kit), tmp_path, strict=True)
    with caplog.at_level(logging.WARNING, logger="accel_bigmodel"):
        result = load_checkpoint_in_model(empty(kit), tmp_path)
    assert "body.layers.2.mlp.0.bias" in caplog.text  # logged, as accelerate logs it
    assert "['extra.weight']" in caplog.text and "were not used when initializing" in caplog.text
    assert result.missing_keys == ["body.layers.2.mlp.0.bias"]
    assert result.unexpected_keys == ["extra.weight"]


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_corrupt_or_truncated_shard_is_named(kit, reference, tmp_path, fmt):
    folder = kit.write_checkpoint(reference, str(tmp_path), fmt, 2)
    shard = sorted(p for p in os.listdir(folder) if not p.endswith(".json"))[1]
    path = os.path.join(folder, shard)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{shard}.*corrupt or truncated"):
        load_checkpoint_in_model(empty(kit), folder)
    with open(path, "wb") as f:
        f.write(b"\x00garbage" * 4)
    with pytest.raises(ValueError, match=rf"{shard}.*corrupt or truncated"):
        load_checkpoint_in_model(empty(kit), folder)


def test_disk_mapped_tensors_point_into_the_safetensors_file(kit, reference, tmp_path):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors")
    model = empty(kit)
    device_map = {"embed": "cpu", "pos": "cpu", "body": "disk", "head": "cpu"}
    with pytest.raises(ValueError, match="no offload_folder"):
        load_checkpoint_in_model(model, path, device_map=device_map)
    offload = tmp_path / "offload"
    load_checkpoint_in_model(model, path, device_map=device_map, offload_folder=offload)
    index = load_offload_index(offload)
    entry = index["body.layers.0.mlp.0.weight"]
    assert entry["file"] == os.path.abspath(path) and entry["offset"] > 0
    assert os.listdir(offload) == ["index.json"]  # nothing copied
    assert model.body.layers[0].mlp[0].weight.is_meta
    scale = model.body.layers[3].scale  # buffers of disk modules hold their stored values
    torch.testing.assert_close(scale, reference.body.layers[3].scale)
    # a dtype change cannot be served in place: those tensors are written as .dat files
    other = empty(kit)
    load_checkpoint_in_model(other, path, device_map, tmp_path / "half", dtype=torch.float16)
    half = load_offload_index(tmp_path / "half")["body.layers.0.mlp.0.weight"]
    assert "file" not in half and half["dtype"] == "float16"  # accelerate's entry: <name>.dat


def test_progress_bar_only_on_a_terminal_or_when_asked(kit, reference, tmp_path, capsys):
    folder = kit.write_checkpoint(reference, str(tmp_path), "safetensors", 3)
    load_checkpoint_in_model(empty(kit), folder)
    assert capsys.readouterr().err == ""  # pytest's stderr is not a terminal
    load_checkpoint_in_model(empty(kit), folder, show_progress=True)
    err = capsys.readouterr().err
    assert "Loading checkpoint shards: 3/3" in err and err.endswith("\n")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    bar = Progress(2, "x", stream=tty)
    bar.update()
    bar.update()
    assert "x: 1/2" in tty.getvalue() and "x: 2/2" in tty.getvalue()
    quiet = Terminal()
    Progress(2, "x", enabled=False, stream=quiet).update()
    assert quiet.getvalue() == ""
