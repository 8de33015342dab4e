"""DataLoaderConfiguration: the data-loading options an Accelerator carries to `prepare_data_loader`."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataLoaderConfiguration:
    """How prepared loaders split data across processes (accelerate's field names).

    - `split_batches`: the loader's batch size is the global batch, split across processes
      (it must divide by the number of processes); otherwise each process gets a full batch.
    - `dispatch_batches`: process 0 reads every batch and sends each process its slice;
      None means "only for iterable datasets when batches are put on a device".
    - `even_batches`: complete the final batches by cycling from the start of the epoch so
      every process gets the same number of batches; off, processes may get different counts.
    - `use_seedable_sampler`: accepted for compatibility; a `RandomSampler` is always replaced
      by a `SeedableRandomSampler` so shuffling is identical on every rank and resumable.
    - `data_seed`: base seed of that sampler (epoch e uses `data_seed + e`).
    - `non_blocking`: device copies are non-blocking (useful with `pin_memory=True`).
    - `use_stateful_dataloader`: rebuild the loader as torchdata's `StatefulDataLoader`.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        for name in (
            "split_batches",
            "even_batches",
            "use_seedable_sampler",
            "non_blocking",
            "use_stateful_dataloader",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"DataLoaderConfiguration.{name} must be a bool, got {value!r}")
        if self.dispatch_batches is not None and not isinstance(self.dispatch_batches, bool):
            raise TypeError(
                f"DataLoaderConfiguration.dispatch_batches must be None or a bool, "
                f"got {self.dispatch_batches!r}"
            )
        if self.data_seed is not None and (
            isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int)
        ):
            raise TypeError(
                f"DataLoaderConfiguration.data_seed must be None or an int, got {self.data_seed!r}"
            )

    def prepare_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `prepare_data_loader` that this configuration sets."""
        return dataclasses.asdict(self)
