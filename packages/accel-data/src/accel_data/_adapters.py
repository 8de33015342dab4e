"""Loader pieces that code written against the familiar data-loader module expects:
a sampler that skips batches, a DataLoader that skips batches, a state mixin and an adapter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, Sampler


class SkipBatchSampler(BatchSampler):
    """The batches of `batch_sampler` after the first `skip_batches`."""

    def __init__(self, batch_sampler: Sampler, skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)


class DataLoaderStateMixin:
    """Tracks whether the iteration reached the last batch, and how many samples it holds."""

    end_of_dataloader: bool = False
    remainder: int = -1

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        self.reset()

    def end(self) -> None:
        self.end_of_dataloader = True


class SkipDataLoader(DataLoader, DataLoaderStateMixin):
    """A DataLoader that skips its first `skip_batches` batches."""

    def __init__(self, dataset: Any, skip_batches: int = 0, **kwargs: Any) -> None:
        kwargs.pop("use_stateful_dataloader", None)
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        for index, batch in enumerate(super().__iter__()):
            if index >= self.skip_batches:
                yield batch
        self.end()

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)


class DataLoaderAdapter:
    """Wraps a DataLoader, delegating everything to it (the base of the prepared loaders in
    code that subclasses it)."""

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        kwargs.pop("use_stateful_dataloader", None)
        self.base_dataloader = DataLoader(dataset, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.base_dataloader)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def state_dict(self) -> dict[str, Any]:
        return getattr(self.base_dataloader, "state_dict", dict)()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if hasattr(self.base_dataloader, "load_state_dict"):
            self.base_dataloader.load_state_dict(state_dict)


def get_sampler(dataloader: Any) -> Sampler | None:
    """The sampler behind `dataloader` (the batch sampler's own sampler when it has one)."""
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None)
    return sampler if sampler is not None else getattr(dataloader, "sampler", None)
