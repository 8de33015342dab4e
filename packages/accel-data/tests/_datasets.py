"""Small real datasets shared by the tests (module-level, so worker processes can load them)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, IterableDataset


class Ids(Dataset):
    """Sample i is {"id": i, "x": [i, -i]}; counts reads in this process."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        self.reads.append(i)
        return {"id": torch.tensor(i), "x": torch.tensor([float(i), -float(i)])}


class Stream(IterableDataset):
    """A stream of n ids with no length."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield {"id": torch.tensor(i), "pair": (torch.tensor([i, i]), torch.tensor(i > 3))}


def ids(batch) -> list[int]:
    return batch["id"].tolist()
