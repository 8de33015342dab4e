"""What DataLoaderShard and DataLoaderDispatcher share: epoch, position, look-ahead, state dict.

The position is (epoch, batches yielded in that epoch), plus what the epoch's order came from:
the state its generators had when it started (the sampler's, the loader's), or the seed of a
SeedableRandomSampler, whose order is a pure function of (seed, epoch). A map-style loader
resumes by drawing the same order again and dropping index batches in the sampler, without
reading the skipped samples.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import IterableDataset

from accel_data._adapters import DataLoaderAdapter, DataLoaderStateMixin, is_stateful_loader
from accel_data._samplers import SeedableRandomSampler, _ResumeBatchSampler

_STATE_VERSION = 1


class IterationObserver(Protocol):
    """Told when an iteration over a prepared loader starts and when it ends."""

    def begin(self, loader: Any) -> None: ...

    def end(self, loader: Any) -> None: ...


def _no_state() -> None:
    return None


def _epoch_targets(*objects: Any) -> list[Any]:
    """Every distinct object that wants to hear the epoch: the given ones, and the samplers
    inside a batch sampler among them."""
    found: list[Any] = []
    for obj in objects:
        inner = getattr(obj, "batch_sampler", None)
        for candidate in (getattr(inner, "sampler", None), inner, getattr(obj, "sampler", None)):
            if candidate is not None and candidate is not obj:
                found.extend(_epoch_targets(candidate))
        if obj is not None and hasattr(obj, "set_epoch"):
            found.append(obj)
    targets: list[Any] = []
    for obj in found:
        if all(obj is not t for t in targets):
            targets.append(obj)
    return targets


def _remainder(dataset: Any, total: int | None, drop_last: bool) -> int:
    """Real samples in the final global batch of a dataset of known length (-1 unknown)."""
    if drop_last:
        return 0
    try:
        return len(dataset) % total if total else -1
    except TypeError:
        return -1


class _PreparedLoader(DataLoaderAdapter, DataLoaderStateMixin):
    """Base of DataLoaderShard and DataLoaderDispatcher. Subclasses provide `_batches(skip)`.

    Built like a DataLoader (the dataset and DataLoader keyword arguments make
    `base_dataloader`); prepare_data_loader then calls `_configure` with what it knows
    about the processes, the user's dataset and the samplers it made.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        device: torch.device | str | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        base = self.base_dataloader
        self._dataset = dataset
        self.num_processes = 1
        self.process_index = 0
        self.device = torch.device(device) if device is not None else None
        self._place = self.device is not None
        self.non_blocking = self._non_blocking = bool(_non_blocking)
        self._drop_last = bool(_drop_last)
        self.skip_batches = int(skip_batches)
        self.torch_device_mesh = torch_device_mesh
        self.iteration_observer: IterationObserver | None = None
        self._prepared = False
        self._seedable: SeedableRandomSampler | None = None
        self._order_gen: torch.Generator | None = None
        self._order_state: torch.Tensor | None = None
        self._pending_order_state: torch.Tensor | None = None
        self._resume: _ResumeBatchSampler | None = None
        batch_sampler = None if isinstance(dataset, IterableDataset) else base.batch_sampler
        self._epoch_targets = _epoch_targets(batch_sampler, dataset)
        size = getattr(batch_sampler, "batch_size", base.batch_size)
        self._total_batch_size: int | None = size
        self._static_remainder = _remainder(dataset, size, _drop_last or base.drop_last)
        self._observed_remainder: int | None = None
        self.end_of_dataloader = False
        self._epoch = int(iteration)
        self._yielded = 0
        self._pending_skip = 0
        self._restored_at: int | None = None
        self._gen_state: torch.Tensor | None = None
        self._pending_gen_state: torch.Tensor | None = None
        self._base_state: dict[str, Any] | None = None
        self._on_init()

    def _on_init(self) -> None:
        """Called once the loader is built: a hook for subclasses (e.g. to set an observer)."""

    def _configure(
        self,
        *,
        dataset: Any,
        num_processes: int,
        process_index: int,
        put_on_device: bool,
        iteration_observer: IterationObserver | None,
        seedable_sampler: SeedableRandomSampler | None,
        order_generator: torch.Generator | None,
        resume_sampler: _ResumeBatchSampler | None,
        epoch_targets: list[Any],
        total_batch_size: int | None,
        static_remainder: int,
    ) -> None:
        """What prepare_data_loader knows: the processes, the user's dataset, its samplers."""
        self._dataset = dataset
        self.num_processes = num_processes
        self.process_index = process_index
        self._place = put_on_device and self.device is not None
        self.iteration_observer = iteration_observer
        self._seedable = seedable_sampler
        self._order_gen = order_generator
        self._resume = resume_sampler
        self._epoch_targets = epoch_targets
        self._total_batch_size = total_batch_size
        self._static_remainder = static_remainder
        self._prepared = True

    def begin(self) -> None:
        """An iteration starts: tell the observer (the trainer's gradient state)."""
        self.end_of_dataloader = False
        self._observed_remainder = None
        if self.iteration_observer is not None:
            self.iteration_observer.begin(self)

    def end(self) -> None:
        """The iteration stopped (finished, or left early): tell the observer."""
        if self.iteration_observer is not None:
            self.iteration_observer.end(self)

    def reset(self) -> None:
        self.end_of_dataloader = False
        self._observed_remainder = None

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        skip = self._pending_skip or self.skip_batches
        self._pending_skip, self._restored_at = 0, None
        self._apply_epoch()
        self._yielded = skip
        self.begin()
        # torchdata's state, taken per batch only over a StatefulDataLoader
        stateful = self._is_stateful
        snapshot = self.base_dataloader.state_dict if stateful else _no_state
        try:
            batches = self._batches(skip)
            current = next(batches, _END)
            if current is _END:
                self._finish_epoch()
                return
            current_state = snapshot()
            for upcoming in batches:  # look one batch ahead to know which batch is the last
                upcoming_state = snapshot() if stateful else None  # no call per batch
                self._yielded += 1
                self._base_state = current_state  # torchdata's state once `current` is consumed
                yield current
                current, current_state = upcoming, upcoming_state
            self._observed_remainder = self._final_remainder()
            self.end_of_dataloader = True
            self._yielded += 1
            if current_state is not None:
                current_state["_iterator_finished"] = True
            self._base_state = current_state
            yield current
            self._finish_epoch()
        finally:
            self.end()

    def _batches(self, skip: int) -> Iterator[Any]:
        raise NotImplementedError

    @property
    def _is_stateful(self) -> bool:
        """The base loader is torchdata's StatefulDataLoader (its state is reported too)."""
        return is_stateful_loader(self.base_dataloader)

    def _final_remainder(self) -> int | None:
        """The remainder observed at the end of the epoch, None when nothing was observed."""
        return None

    def _finish_epoch(self) -> None:
        self._epoch += 1
        self._yielded = 0
        self._gen_state = self._order_state = None  # the next epoch starts from their live state

    def _start_order(self) -> None:
        """Set the sampler's generator to where this epoch's order starts, and record it: the
        restored state on a resume; else, with several processes, process 0's state."""
        gen = self._order_gen
        if gen is None:
            return
        if self._pending_order_state is not None:
            gen.set_state(self._pending_order_state)
        elif self._sync_order and self._order_spans_processes():
            import torch.distributed as dist

            state = gen.get_state()
            dist.broadcast(state, src=0)
            gen.set_state(state)
        self._pending_order_state = None
        self._order_state = gen.get_state()

    _sync_order = True  # the dispatcher reads on process 0 only: nothing to agree on

    def _order_spans_processes(self) -> bool:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return False
        return self.num_processes > 1 or self.torch_device_mesh is not None

    def _base_iterator(self, skip: int) -> Iterator[Any]:
        """Start the base loader at batch `skip` (sampler-level when it has a batch sampler)."""
        self._start_order()
        gen = getattr(self.base_dataloader, "generator", None)
        if self._prepared and (gen is None or getattr(self, "_owns_generator", False)):
            # No generator of the user's: creating the iterator would draw the workers' base
            # seed from the global RNG, so a resumed run (whose global RNG was restored
            # mid-epoch) would diverge from an unbroken one (dropout masks, augmentation).
            # A private generator seeded from (seed, epoch) keeps both streams exact.
            if gen is None:
                gen = torch.Generator()
                self.base_dataloader.generator = gen
                self._owns_generator = True
            seed = 0 if self._seedable is None else int(self._seedable.seed)
            gen.manual_seed((seed * 1_000_003 + self._epoch) % (2**63))
            self._pending_gen_state = None
        if gen is not None:
            if self._pending_gen_state is not None:
                gen.set_state(self._pending_gen_state)
            self._gen_state = gen.get_state()
        self._pending_gen_state = None
        if self._resume is None:
            it = iter(self.base_dataloader)
            for _ in range(skip):  # a stream: the skipped batches must be read
                if next(it, _END) is _END:
                    break
            return it
        # The skip stays set while the base iterator starts: with workers, the DataLoader
        # iterates its batch sampler more than once while starting.
        self._resume.skip = skip
        try:
            return iter(self.base_dataloader)
        finally:
            self._resume.skip = 0

    # -- epochs ------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of `epoch` from the next iteration on.

        Calling it with the epoch a restored loader is already in keeps the restored position
        (scripts call `set_epoch(epoch)` at the top of each epoch after a resume); any other
        epoch starts at its first batch.
        """
        epoch = int(epoch)
        if epoch != self._epoch:
            self._pending_skip, self._restored_at, self._yielded = 0, None, 0
            self._pending_gen_state = self._pending_order_state = None
            self._gen_state = self._order_state = None
        self._epoch = epoch
        self._apply_epoch()

    def _apply_epoch(self) -> None:
        for target in self._epoch_targets:
            target.set_epoch(self._epoch)

    @property
    def iteration(self) -> int:
        """The current epoch (accelerate's name)."""
        return self._epoch

    @iteration.setter
    def iteration(self, epoch: int) -> None:
        self.set_epoch(epoch)

    # -- what a trainer asks ------------------------------------------------------------------
    @property
    def dataset(self) -> Any:
        """The dataset the user passed (not the per-process shard)."""
        return self._dataset

    @property
    def total_batch_size(self) -> int | None:
        """Samples in one global batch (all processes together); None for varying batches."""
        return self._total_batch_size

    @property
    def total_dataset_length(self) -> int | None:
        """Length of the user's dataset, None when it has none (a stream)."""
        try:
            return len(self._dataset)
        except TypeError:
            return None

    @property
    def remainder(self) -> int:
        """Real samples in the final global batch when it is short, else 0; -1 when unknown.

        With accelerate's meaning: gather_for_metrics keeps the first `remainder` samples of
        the final gathered batch when it is positive (the rest are padding duplicates). It is
        computed from the dataset length when that is known; for a stream it is observed at
        its end, before the last batch is yielded (thanks to the one-batch look-ahead), when
        the stream is read in this process (dispatch_batches, or num_workers=0).
        """
        if self._observed_remainder is not None:
            return self._observed_remainder
        return self._static_remainder

    def __getattr__(self, name: str) -> Any:
        # Loader options (batch_size, num_workers, collate_fn, ...) read through to the base.
        if name.startswith("_") or name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position as plain values: epoch, batches yielded in it, shuffle seed, generator.

        Over torchdata's StatefulDataLoader (`use_stateful_dataloader=True`) it is torchdata's
        own state dict as it was when the last batch handed out was fetched (the base loader
        runs one batch ahead); a prepared loader adds accel's keys, which resume exactly
        (shuffle seed, epoch, number of processes).
        """
        extra: dict[str, Any] = {}
        if self._is_stateful:
            extra = dict(self._base_state or self.base_dataloader.state_dict())
            if not self._prepared:
                return extra
        loader_gen = getattr(self.base_dataloader, "generator", None)
        order_gen = None if self._order_gen is loader_gen else self._order_gen
        return {
            **extra,
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches_yielded": self._yielded,
            "seed": None if self._seedable is None else self._seedable.seed,
            "generator_state": _epoch_start(self._gen_state, loader_gen),
            "order_generator_state": _epoch_start(self._order_state, order_gen),
            "num_processes": self.num_processes,
            "loader": self._identity(),
        }

    def _identity(self) -> dict[str, Any]:
        """What makes a saved position this loader's: its data, batching and order."""
        kind = "stream"
        if self._resume is not None:
            inner = self._resume.batch_sampler
            while hasattr(inner, "batch_sampler"):
                inner = inner.batch_sampler
            kind = type(getattr(inner, "sampler", None) or inner).__name__
        return {
            "dataset_length": self.total_dataset_length,
            "total_batch_size": self._total_batch_size,
            "sampler": kind,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a position: the next iteration yields exactly what an unbroken run would.

        Takes what `state_dict()` returned, or, over torchdata's StatefulDataLoader, a state
        dict of torchdata's own. A position saved by another loader (another dataset length,
        global batch size, sampler or number of processes; a loader built over the samples
        not yet seen, say) is not applied: a warning names both and this loader starts at its
        beginning, as accelerate's loaders do (`skip_first_batches` still skips).
        """
        missing = {"epoch", "batches_yielded", "num_processes"} - set(state_dict)
        if len(missing) == 3 and self._is_stateful:  # torchdata's own state dict
            self.base_dataloader.load_state_dict(state_dict)
            self._pending_skip, self._restored_at, self._yielded = 0, None, 0
            self._base_state = dict(state_dict)
            return
        if missing:
            raise KeyError(
                f"not a data loader state dict: missing {sorted(missing)}; expected the dict "
                f"returned by state_dict() of a DataLoaderShard or DataLoaderDispatcher"
            )
        position = int(state_dict["batches_yielded"])
        other = self._other_loader(state_dict, position)
        if other is not None:
            warnings.warn(
                f"load_state_dict: the saved data position (batch {position} of epoch "
                f"{state_dict['epoch']}) was saved by another loader ({other}), so it is not "
                f"applied: this loader starts at its beginning, as accelerate's does. Prepare "
                f"the loader as in the saved run to resume exactly, or skip what was consumed "
                f"with skip_first_batches.",
                stacklevel=2,
            )
            return
        seed = state_dict.get("seed")
        if seed is not None and self._seedable is not None:
            self._seedable.seed = int(seed)
        self._epoch = int(state_dict["epoch"])
        self._yielded = self._pending_skip = position
        self._restored_at = self._pending_skip
        self._pending_gen_state = state_dict.get("generator_state")
        self._gen_state = self._pending_gen_state
        self._pending_order_state = state_dict.get("order_generator_state")
        loader_gen = getattr(self.base_dataloader, "generator", None)
        if self._pending_order_state is None and self._order_gen is loader_gen:
            # the order came from the loader's generator (one object): restore it alike
            self._pending_order_state = self._pending_gen_state
        self._order_state = self._pending_order_state
        self._apply_epoch()

    def _other_loader(self, state: dict[str, Any], position: int) -> str | None:
        """How the loader that saved `state` differs from this one (None: it is this one)."""
        saved = {"num_processes": state["num_processes"], **state.get("loader", {})}
        now = {"num_processes": self.num_processes, **self._identity()}
        differ = [k for k in saved if k in now and saved[k] != now[k]]
        if differ:
            return ", ".join(f"{k} {saved[k]!r} then, {now[k]!r} now" for k in differ)
        try:  # a state written before the loader was recorded: its position must fit
            length = len(self)
        except TypeError:  # a stream of unknown length
            return None
        if position > length:
            return f"{position} batches read, this loader has {length} per epoch"
        return None

    def _skip_next(self, num_batches: int) -> None:
        """Start the next iteration at batch `num_batches` of the current epoch."""
        self._pending_skip = num_batches
        self._yielded = num_batches
        self._restored_at = None

    def _restored_position(self) -> int | None:
        return self._restored_at

    def _warn_restored(self, num_batches: int) -> None:
        warnings.warn(
            f"skip_first_batches(loader, {num_batches}): the loader was restored by "
            f"load_state_dict to batch {num_batches} of epoch {self._epoch} already, so it is "
            f"not skipped a second time (returning the restored loader).",
            stacklevel=3,
        )


def _epoch_start(recorded: torch.Tensor | None, gen: torch.Generator | None) -> Any:
    """A generator's state where the current epoch started (recorded when it started or
    restored), or, between epochs, its live state: where the next epoch will start."""
    if gen is None:
        return None
    return gen.get_state() if recorded is None else recorded.clone()


_END = object()
