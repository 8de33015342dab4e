"""skip_first_batches: start the current epoch at a given batch (accelerate's resume idiom)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from accel_data._base import _PreparedLoader
from accel_data._samplers import _ResumeBatchSampler


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
        if not first:
            return iter(loader)
        if isinstance(loader, _PreparedLoader):
            loader._skip_next(self._num_batches)
            return iter(loader)
        return _skip_plain(loader, self._num_batches)

    def __len__(self) -> int:
        full = len(self._loader)
        return full if self._used else max(full - self._num_batches, 0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._loader, name)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """Return a loader that starts at batch `num_batches` of the current epoch.

    It behaves normally afterwards (the following epochs are whole), and for a prepared
    loader it shares the loader's epoch counter. A map-style loader skips index batches
    without reading the skipped samples; a stream is read and dropped.

    A prepared loader that `load_state_dict` just restored to batch `num_batches` (and that
    has not been iterated since) is returned as it is, with a warning: it already starts
    there, and a script written for accelerate (load the state, then skip) must not skip twice.
    """
    if not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches must be an int >= 0, got {num_batches!r}")
    if isinstance(dataloader, _PreparedLoader):
        restored = dataloader._restored_position()
        if restored is not None and restored == num_batches:
            dataloader._warn_restored(num_batches)
            return dataloader
    elif not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"skip_first_batches expects a DataLoader or a prepared loader, got "
            f"{type(dataloader).__name__}"
        )
    return _SkipFirst(dataloader, num_batches)


def _skip_plain(loader: DataLoader, num_batches: int) -> Iterator[Any]:
    """Iterate a plain DataLoader from batch `num_batches`."""
    batch_sampler = loader.batch_sampler
    if isinstance(loader.dataset, IterableDataset) or batch_sampler is None:
        it = iter(loader)
        for _ in range(num_batches):
            next(it, None)
        return it
    # Skip at the index level: a one-off loader over the same dataset and options.
    from accel_data._prepare import _rebuild

    resume = _ResumeBatchSampler(batch_sampler)
    resume.skip = num_batches
    one_off = _rebuild(loader, DataLoader, loader.dataset, batch_sampler=resume)
    return iter(one_off)
