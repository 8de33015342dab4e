"""accelerate.test_utils.training: the regression toy problem accelerate's tests train on,
y = a*x + b with noise, and a two-parameter model that learns a and b."""

from __future__ import annotations

import numpy as np
import torch


class RegressionDataset:
    """`length` samples ``{"x": x, "y": a*x + b + noise}`` (float32), reproducible with `seed`."""

    def __init__(
        self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None
    ) -> None:
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, np.float32]:
        return {"x": self.x[i], "y": self.y[i]}


class RegressionModel(torch.nn.Module):
    """``x * a + b`` with scalar parameters `a` and `b`; prints the dtypes on its first call."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x: torch.Tensor | None = None) -> torch.Tensor:
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b
