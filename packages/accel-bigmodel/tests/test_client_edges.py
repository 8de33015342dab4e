"""Edges that transformers' `from_pretrained(device_map=...)` relies on."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from accel_bigmodel import dispatch_model, get_max_memory


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def test_a_module_list_mapped_whole_to_disk_runs(tmp_path: Path) -> None:
    # A ModuleList is never called: each of its blocks must load its own weights.
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(3, 4)
    expected = model(x)
    device_map = {"embed": "cpu", "layers": "disk", "head": "disk"}
    dispatched = dispatch_model(model, device_map, offload_dir=tmp_path)
    assert all(p.is_meta for p in dispatched.layers.parameters())
    assert torch.equal(dispatched(x), expected)


class Holder(nn.Module):
    """Holds the layers but has no forward: the parent iterates them (as a decoder whose
    `model.layers` is mapped whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))


class Nested(Stack):
    def __init__(self) -> None:
        super().__init__()
        del self.layers
        self.body = Holder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.body.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def test_a_container_without_forward_planned_to_disk_runs(tmp_path: Path) -> None:
    # device_map="auto" with a small max_memory sends the whole `body` to disk; its own
    # forward is never called, so its blocks must each load their weights.
    from safetensors.torch import save_file

    from accel_bigmodel import init_empty_weights, load_checkpoint_and_dispatch

    torch.manual_seed(0)
    model, x = Nested(), torch.randn(3, 4)
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    with init_empty_weights():
        empty = Nested()
    body = sum(p.numel() * 4 for p in model.body.parameters())
    embed = sum(p.numel() * 4 for p in model.embed.parameters())
    dispatched = load_checkpoint_and_dispatch(
        empty, tmp_path, device_map="auto", max_memory={"cpu": embed + body // 2},
        offload_folder=tmp_path / "offload",
    )  # fmt: skip
    assert dispatched.hf_device_map["body"] == "disk"
    assert all(p.is_meta for p in dispatched.body.parameters())
    assert torch.equal(dispatched(x), model(x))
    # The same by a hand-written map.
    with init_empty_weights():
        empty = Nested()
    device_map = {"embed": "cpu", "body": "disk", "head": "cpu"}
    dispatched = load_checkpoint_and_dispatch(
        empty, tmp_path, device_map=device_map, offload_folder=tmp_path / "offload2"
    )
    assert torch.equal(dispatched(x), model(x))


def test_size_strings_in_the_callers_dict_become_bytes() -> None:
    # transformers compares the caller's max_memory values with the result afterwards.
    asked = {"cpu": "2MB"}
    assert get_max_memory(asked) == {"cpu": 2 * 10**6}
    assert asked == {"cpu": 2 * 10**6}


def test_an_index_into_a_safetensors_file_hands_out_the_entrys_dtype(tmp_path: Path) -> None:
    """transformers points its disk-offload index at the checkpoint's own safetensors files,
    with the dtype the model was loaded in (`dtype=torch.float16` over float32 files)."""
    from safetensors.torch import save_file

    from accel_bigmodel import OffloadedWeightsLoader

    weight = torch.randn(3, 5)
    path = tmp_path / "model.safetensors"
    save_file({"w": weight}, str(path))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        index = {"w": {"safetensors_file": str(path), "weight_name": "w", "dtype": name}}
        got = OffloadedWeightsLoader(index=index)["w"]
        assert got.dtype == dtype and torch.equal(got, weight.to(dtype)), name
