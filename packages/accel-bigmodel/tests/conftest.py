"""A small language-model-shaped network and checkpoint writers shared by the tests.

The model has what breaks naive big-model code: a weight tied in ``__init__`` (embedding and
head), persistent buffers whose stored values differ from their init values, a top-level
buffer, and nested blocks that must not be split.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

DIM, VOCAB, LAYERS, SEQ = 32, 64, 4, 8


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.register_buffer("scale", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x)) * self.scale


class Body(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class TinyLM(nn.Module):
    def __init__(self, dim: int = DIM, vocab: int = VOCAB, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = Body(dim, layers)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("pos", torch.zeros(SEQ, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[-1]]
        return self.head(self.body(x))


def make_reference(seed: int = 0) -> TinyLM:
    """A TinyLM whose buffers hold values an empty init would not reproduce."""
    torch.manual_seed(seed)
    model = TinyLM()
    with torch.no_grad():
        model.pos.copy_(torch.randn(SEQ, DIM))
        for block in model.body.layers:
            block.scale.copy_(torch.rand(DIM) + 0.5)
    return model.eval()


def untied_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared tensor once (as save_model writes it)."""
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().clone().contiguous()
    return state


def write_checkpoint(model: nn.Module, folder: str, fmt: str, shards: int = 1) -> str:
    """Write `model` as fmt in {"safetensors", "bin", "pt"}; sharded with an index if shards>1."""
    os.makedirs(folder, exist_ok=True)
    state = untied_state_dict(model)
    ext = {"safetensors": "safetensors", "bin": "bin", "pt": "pt"}[fmt]
    stem = "model" if fmt == "safetensors" else "pytorch_model"

    def save(part: dict, path: str) -> None:
        if fmt == "safetensors":
            save_file(part, path, metadata={"format": "pt"})
        else:
            torch.save(part, path)

    if shards == 1:
        path = os.path.join(folder, f"{stem}.{ext}")
        save(state, path)
        return path
    names = list(state)
    size = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = {n: state[n] for n in names[i * size : (i + 1) * size]}
        shard = f"{stem}-{i + 1:05d}-of-{shards:05d}.{ext}"
        save(part, os.path.join(folder, shard))
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(folder, f"{stem}.{ext}.index.json"), "w") as f:
        json.dump(index, f)
    return folder


@pytest.fixture
def reference() -> TinyLM:
    return make_reference()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def kit():
    """The helpers above, for test modules (which cannot import this file by name)."""
    import types

    return types.SimpleNamespace(
        TinyLM=TinyLM,
        Block=Block,
        make_reference=make_reference,
        untied_state_dict=untied_state_dict,
        write_checkpoint=write_checkpoint,
        DIM=DIM,
        VOCAB=VOCAB,
        LAYERS=LAYERS,
        SEQ=SEQ,
    )
