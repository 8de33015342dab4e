"""skip_first_batches: start the current epoch at a given batch (accelerate's resume idiom)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from accel_data._adapters import SkipBatchSampler, SkipDataLoader
from accel_data._base import _PreparedLoader


class _SkipFirst:
    """A view of a loader whose first iteration starts at batch `num_batches`.

    Later iterations are whole epochs. Progress (epoch, position) is the viewed loader's own,
    so the epoch counter moves on exactly as if the loader itself had been iterated.
    """

    def __init__(self, loader: Any, num_batches: int) -> None:
        self._loader = loader
        self._num_batches = num_batches
        self._used = False

    def __iter__(self) -> Iterator[Any]:
        first, self._used = not self._used, True
        loader = self._loader
        if first:
            loader._skip_next(self._num_batches)
        return iter(loader)

    def __len__(self) -> int:
        full = len(self._loader)
        return full if self._used else max(full - self._num_batches, 0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._loader, name)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """Return a loader that starts at batch `num_batches` of the current epoch.

    For a prepared loader: a view sharing the loader's epoch counter, whose later epochs
    are whole. A prepared loader that `load_state_dict` just restored to batch `num_batches`
    (and that has not been iterated since) is returned as it is, with a warning: it already
    starts there, and a script written for accelerate (load the state, then skip) must not
    skip twice.

    For a plain DataLoader, as accelerate does: a new DataLoader (which `prepare` accepts)
    that skips the first `num_batches` batches of every iteration; use the original loader
    for the following epochs. A map-style loader skips index batches without reading the
    skipped samples; a stream is read and dropped.
    """
    if not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches must be an int >= 0, got {num_batches!r}")
    if isinstance(dataloader, _PreparedLoader):
        restored = dataloader._restored_position()
        if restored is not None and restored == num_batches:
            dataloader._warn_restored(num_batches)
            return dataloader
        return _SkipFirst(dataloader, num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"skip_first_batches expects a DataLoader or a prepared loader, got "
            f"{type(dataloader).__name__}"
        )
    return _skipping_loader(dataloader, num_batches)


def _skipping_loader(loader: DataLoader, num_batches: int) -> DataLoader:
    """A loader like `loader` whose iterations start at batch `num_batches`."""
    from accel_data._prepare import _loader_options

    dataset, options = loader.dataset, _loader_options(loader, False)
    batch_sampler = loader.batch_sampler
    if isinstance(dataset, IterableDataset):
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
        return SkipDataLoader(dataset, skip_batches=num_batches, **batching, **options)
    if batch_sampler is None and isinstance(loader.sampler, BatchSampler):
        skipping = SkipBatchSampler(loader.sampler, num_batches)
        return DataLoader(dataset, sampler=skipping, batch_size=None, **options)
    if batch_sampler is None:  # no automatic batching: each sample is a batch
        unbatched = {"sampler": loader.sampler, "batch_size": None}
        return SkipDataLoader(dataset, skip_batches=num_batches, **unbatched, **options)
    skipping = SkipBatchSampler(batch_sampler, num_batches)
    return DataLoader(dataset, batch_sampler=skipping, **options)
