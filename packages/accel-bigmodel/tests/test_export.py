"""Weights written for inference: one file or shards with an index, read back by the loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_bigmodel import (
    checkpoint_files,
    load_checkpoint_in_model,
    load_weights_file,
    save_sharded_weights,
    save_weights_file,
)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight


def test_one_file_keeps_tied_names(tmp_path: Path) -> None:
    model = _Tied()
    save_weights_file(model.state_dict(), tmp_path / "w.safetensors")
    got = load_weights_file(tmp_path / "w.safetensors")
    assert set(got) == set(model.state_dict())
    assert torch.equal(got["head.weight"], model.embed.weight.detach())


@pytest.mark.parametrize("safe", [True, False])
def test_shards_with_an_index_load_back(tmp_path: Path, safe: bool) -> None:
    model = _Tied()
    folder = tmp_path / "export"
    save_sharded_weights(model.state_dict(), folder, max_shard_size=100, safe_serialization=safe)
    stem, suffix = ("model", ".safetensors") if safe else ("pytorch_model", ".bin")
    index = json.loads((folder / f"{stem}{suffix}.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all(f.startswith(f"{stem}-") and f.endswith(suffix) for f in files)
    assert "head.weight" not in index["weight_map"]  # tied: written once
    assert [Path(f).name for f in checkpoint_files(folder)] == files
    fresh = _Tied()
    load_checkpoint_in_model(fresh, folder, strict=True)
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name


def test_a_second_export_replaces_the_first(tmp_path: Path) -> None:
    model = _Tied()
    folder = tmp_path / "export"
    save_sharded_weights(model.state_dict(), folder, max_shard_size=100)
    save_sharded_weights(model.state_dict(), folder)
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]
    assert not (tmp_path / ".export.incomplete").exists()
