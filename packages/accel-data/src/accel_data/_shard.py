"""DataLoaderShard: every process reads its own share of the data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

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

    Built directly, it takes a dataset and DataLoader keyword arguments, as a DataLoader
    does (accelerate's signature): `device` moves each batch there, `skip_batches` skips the
    first batches of every iteration, `iteration` is the starting epoch. `rng_types` and
    `synchronized_generator` are kept for the caller that synchronizes random states
    (the umbrella `accel` does, at the start of each epoch); this package does not.
    """

    def __init__(
        self,
        dataset: Any,
        device: torch.device | str | None = None,
        rng_types: list[Any] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset,
            device=device,
            skip_batches=skip_batches,
            use_stateful_dataloader=use_stateful_dataloader,
            _drop_last=_drop_last,
            _non_blocking=_non_blocking,
            torch_device_mesh=torch_device_mesh,
            iteration=iteration,
            **kwargs,
        )
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator

    def __len__(self) -> int:
        return len(self.base_dataloader)

    @property
    def batch_sampler(self) -> Any:
        """The per-process batch sampler (None for an iterable dataset)."""
        if self._resume is not None:
            return self._resume.batch_sampler
        if isinstance(self.base_dataloader.dataset, IterableDataset):
            return None
        return self.base_dataloader.batch_sampler

    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this process."""
        shard = self.batch_sampler
        if not isinstance(shard, BatchSamplerShard):
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
        if isinstance(shard, BatchSamplerShard):
            real = shard.last_round_real
        elif shard is not None:
            return None
        else:
            dataset = self.base_dataloader.dataset
            real = getattr(dataset, "last_batch_real", -1)
            if not isinstance(dataset, IterableDatasetShard) or self.base_dataloader.num_workers:
                real = -1  # the stream was read in worker processes: not observed here
        return None if real < 0 else real
