"""DataLoaderShard: every process reads its own share of the data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from accel_data._base import _PreparedLoader
from accel_data._iterable import IterableDatasetShard
from accel_data._ops import send_to_device
from accel_data._samplers import BatchSamplerShard


class DataLoaderShard(_PreparedLoader):
    """A prepared loader whose process reads only its own batches (made by prepare_data_loader).

    Iterate it like the DataLoader it wraps (`base_dataloader`, whose options read through).
    For a trainer it also offers:

    - `set_epoch(epoch)`: the shuffle of that epoch (it also advances by itself after each
      full pass);
    - `end_of_dataloader`: True while the batch just yielded is the last of the epoch (the
      loader reads one batch ahead to know it);
    - `remainder`, `total_batch_size`, `total_dataset_length`: to drop padding duplicates
      when gathering metrics;
    - `state_dict()` / `load_state_dict(sd)`: resume exactly mid-epoch;
    - `iteration_observer`: an object whose `begin(loader)` / `end(loader)` are called when
      an iteration starts and when it finishes, is closed or is garbage-collected;
    - `batch_sampler` (a BatchSamplerShard, map-style), `dataset` (the user's), `device`.
    """

    def __len__(self) -> int:
        return len(self.base_dataloader)

    @property
    def batch_sampler(self) -> BatchSamplerShard | None:
        """The per-process batch sampler (None for an iterable dataset)."""
        return None if self._resume is None else self._resume.batch_sampler

    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this process."""
        shard = self.batch_sampler
        if shard is None:
            return self.base_dataloader.batch_size
        if shard.batch_size is None:
            return None
        return shard.batch_size // self.num_processes if shard.split_batches else shard.batch_size

    def _batches(self, skip: int) -> Iterator[Any]:
        it = self._base_iterator(skip)
        if not self._place:
            return it
        device, non_blocking = self.device, self.non_blocking
        return (send_to_device(b, device, non_blocking) for b in it)

    def _final_remainder(self) -> int | None:
        shard = self.batch_sampler
        if shard is not None:
            real = shard.last_round_real
        else:
            dataset = self.base_dataloader.dataset
            real = getattr(dataset, "last_batch_real", -1)
            if not isinstance(dataset, IterableDatasetShard) or self.base_dataloader.num_workers:
                real = -1  # the stream was read in worker processes: not observed here
        return None if real < 0 else real
