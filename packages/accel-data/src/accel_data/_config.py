"""DataLoaderConfiguration: the data-loading options an Accelerator carries to `prepare_data_loader`."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How prepared loaders split data across processes (accelerate's fields, in its order).

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

    Fields may be assigned after creation, as transformers' Trainer does; every assignment is
    validated, and an unknown name is refused.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        fields = {f.name for f in dataclasses.fields(self)}
        if name not in fields:
            raise AttributeError(
                f"DataLoaderConfiguration has no field {name!r}; fields: {sorted(fields)}."
            )
        _check(name, value)
        object.__setattr__(self, name, value)

    def prepare_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `prepare_data_loader` that this configuration sets."""
        return dataclasses.asdict(self)


def _check(name: str, value: Any) -> None:
    """Validate one field of DataLoaderConfiguration."""
    if name == "dispatch_batches":
        if value is not None and not isinstance(value, bool):
            raise TypeError(
                f"DataLoaderConfiguration.dispatch_batches must be None or a bool, got {value!r}"
            )
    elif name == "data_seed":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(
                f"DataLoaderConfiguration.data_seed must be None or an int, got {value!r}"
            )
    elif not isinstance(value, bool):
        raise TypeError(f"DataLoaderConfiguration.{name} must be a bool, got {value!r}")
