"""Small models and data shared by the umbrella's tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


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
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])
