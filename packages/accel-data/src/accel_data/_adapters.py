"""Loader pieces that code written against the familiar data-loader module expects: the
adapter every accel loader is built on, a state mixin, and batch skipping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, Sampler

_STATEFUL_VARIANTS: dict[type, type] = {}


def stateful_loader_class() -> type:
    """torchdata's StatefulDataLoader, imported on first use (an optional dependency)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as err:
        raise ImportError(
            "use_stateful_dataloader=True needs torchdata >= 0.8: pip install torchdata"
        ) from err
    return StatefulDataLoader


def is_stateful_loader(loader: Any) -> bool:
    """`loader` is torchdata's StatefulDataLoader (or a subclass of it)."""
    return any(
        c.__name__ == "StatefulDataLoader" and c.__module__.startswith("torchdata.")
        for c in type(loader).__mro__
    )


def _restore(cls: type, state: dict[str, Any]) -> Any:
    """Unpickle an adapter whose class is a stateful variant made at run time."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    if state.get("use_stateful_dataloader"):
        obj.__class__ = _stateful_variant(cls)
    return obj


def _stateful_variant(cls: type) -> type:
    """`cls` mixed with StatefulDataLoader, so the object is an instance of both."""
    variant = _STATEFUL_VARIANTS.get(cls)
    if variant is None:

        def __reduce__(self: Any) -> tuple:
            return (_restore, (cls, dict(self.__dict__)))

        body = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        variant = type(cls.__name__, (cls, stateful_loader_class()), body)
        variant.__reduce__ = __reduce__  # type: ignore[method-assign]
        _STATEFUL_VARIANTS[cls] = variant
    return variant


class DataLoaderAdapter(DataLoader):
    """A DataLoader that wraps another one, `base_dataloader`, built from the same arguments.

    It is an instance of `DataLoader` (and, with `use_stateful_dataloader=True`, of torchdata's
    `StatefulDataLoader`, whose state it reports), so code that checks the type keeps working;
    options not defined here (batch_size, num_workers, collate_fn, ...) read through to the
    base loader. Subclasses change what iterating yields.
    """

    def __init__(
        self,
        dataset: Any,
        use_stateful_dataloader: bool = False,
        batch_sampler: Any = None,
        **kwargs: Any,
    ) -> None:
        self.use_stateful_dataloader = bool(use_stateful_dataloader)
        base_cls = stateful_loader_class() if use_stateful_dataloader else DataLoader
        self.base_dataloader = base_cls(dataset, batch_sampler=batch_sampler, **kwargs)
        if use_stateful_dataloader and not isinstance(self, base_cls):
            self.__class__ = _stateful_variant(type(self))

    def __getattr__(self, name: str) -> Any:
        if name == "base_dataloader" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.base_dataloader)

    def __len__(self) -> int:
        return len(self.base_dataloader)

    def state_dict(self) -> dict[str, Any]:
        """The base loader's state (torchdata's StatefulDataLoader has one), else {}."""
        return dict(getattr(self.base_dataloader, "state_dict", dict)())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not hasattr(self.base_dataloader, "load_state_dict"):
            raise TypeError(
                f"{type(self).__name__} over a plain DataLoader has no state to load; build it "
                f"with use_stateful_dataloader=True (torchdata) to resume mid-epoch."
            )
        self.base_dataloader.load_state_dict(state_dict)


class DataLoaderStateMixin:
    """Tracks whether the iteration reached the last batch, and how many samples it holds.

    `end_of_dataloader` is True while the last batch is handed out; `remainder` is the
    number of real samples in the final global batch (-1 when unknown).
    """

    end_of_dataloader: bool = False
    remainder: int = -1

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Called when an iteration starts."""
        self.reset()

    def end(self) -> None:
        """Called when an iteration stops (finished, or left early)."""


class SkipBatchSampler(BatchSampler):
    """The batches of `batch_sampler` after the first `skip_batches`."""

    def __init__(self, batch_sampler: Sampler, skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
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


class SkipDataLoader(DataLoaderAdapter, DataLoaderStateMixin):
    """A DataLoader that skips the first `skip_batches` batches of every iteration.

    The skipped batches are read (this works for streams); to skip a map-style loader
    without reading, use `skip_first_batches`, which skips index batches instead.
    """

    def __init__(
        self,
        dataset: Any,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        try:
            for index, batch in enumerate(self.base_dataloader):
                if index >= self.skip_batches:
                    yield batch
            self.end_of_dataloader = True
        finally:
            self.end()

    def __len__(self) -> int:
        return max(len(self.base_dataloader) - self.skip_batches, 0)


def get_sampler(dataloader: Any) -> Sampler | None:
    """The sampler behind `dataloader` (the batch sampler's own sampler when it has one)."""
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None)
    return sampler if sampler is not None else getattr(dataloader, "sampler", None)
