"""Toy models and data for the tests: a residual stack cut into inp -> blocks -> out (what a
pipeline plan, a tensor-parallel plan and an FSDP wrap policy work on), and a small regression
problem."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

__all__ = ["Block", "RegressionData", "Stack", "loss_of", "make_model"]


class Block(nn.Module):
    """A residual block: ``x + down(tanh(up(x)))`` with ``up: width -> hidden`` and ``down:
    hidden -> width``; with ``hidden=None``, one layer: ``x + tanh(fc(x))``."""

    def __init__(self, width: int, hidden: int | None = None) -> None:
        super().__init__()
        self.hidden = hidden
        if hidden is None:
            self.fc = nn.Linear(width, width)
        else:
            self.up = nn.Linear(width, hidden)
            self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden is None:
            return x + torch.tanh(self.fc(x))
        return x + self.down(torch.tanh(self.up(x)))


class Stack(nn.Module):
    """``inp: in_features -> width``, `depth` Blocks of `width` (and `hidden`, see Block) in
    ``blocks``, ``out: width -> out_features``; the modules are made (and their weights drawn)
    in that order. As transformers models do, it declares its blocks unsplittable.

    The tests subclass it under their own name (``class Net(Stack)``) where a class name shows
    in what they check (FSDP2's ``FSDPNet``, an error message) or to declare a ``_tp_plan``."""

    _no_split_modules = ["Block"]

    def __init__(
        self,
        width: int = 16,
        depth: int = 2,
        hidden: int | None = None,
        in_features: int = 8,
        out_features: int = 1,
    ) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(depth))
        self.out = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class RegressionData(Dataset):
    """y = 2x + 3 + noise, with each sample carrying its index."""

    def __init__(self, length: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, 4, generator=g)
        self.y = (
            self.x @ torch.tensor([[2.0], [-1.0], [0.5], [1.0]])
            + 3
            + 0.1 * torch.randn(length, 1, generator=g)
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "index": torch.tensor(i)}


def make_model(seed: int = 0) -> nn.Module:
    """A 4 -> 8 -> 1 tanh MLP for RegressionData, its weights drawn after seeding torch."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])
