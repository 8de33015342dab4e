"""What DataLoaderShard and DataLoaderDispatcher share: epoch, position, look-ahead, state dict.

The position is (epoch, batches yielded in that epoch). Shuffling is a pure function of
(seed, epoch) (see SeedableRandomSampler), so these numbers and the seed are all a resume
needs; a map-style loader resumes by dropping index batches in the sampler, without reading
the skipped samples.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from accel_data._samplers import SeedableRandomSampler, _ResumeBatchSampler

_STATE_VERSION = 1


class IterationObserver(Protocol):
    """Told when an iteration over a prepared loader starts and when it ends."""

    def begin(self, loader: Any) -> None: ...

    def end(self, loader: Any) -> None: ...


def _no_state() -> None:
    return None


class _PreparedLoader:
    """Base of the prepared loaders. Subclasses provide `_batches(skip)` and `__len__`."""

    def __init__(
        self,
        base_dataloader: Any,
        *,
        dataset: Any,
        num_processes: int,
        process_index: int,
        device: torch.device | str | None,
        put_on_device: bool,
        non_blocking: bool,
        iteration_observer: IterationObserver | None,
        seedable_sampler: SeedableRandomSampler | None,
        resume_sampler: _ResumeBatchSampler | None,
        epoch_targets: list[Any],
        total_batch_size: int | None,
        static_remainder: int,
    ) -> None:
        self.base_dataloader = base_dataloader
        self._dataset = dataset
        self.num_processes = num_processes
        self.process_index = process_index
        self.device = torch.device(device) if device is not None else None
        self._place = put_on_device and self.device is not None
        self.non_blocking = non_blocking
        self.iteration_observer = iteration_observer
        self._seedable = seedable_sampler
        self._resume = resume_sampler
        self._epoch_targets = epoch_targets
        self._total_batch_size = total_batch_size
        self._static_remainder = static_remainder
        self._observed_remainder: int | None = None
        self.end_of_dataloader = False
        self._epoch = 0
        self._yielded = 0
        self._pending_skip = 0
        self._restored_at: int | None = None
        self._gen_state: torch.Tensor | None = None
        self._pending_gen_state: torch.Tensor | None = None
        self._base_state: dict[str, Any] | None = None

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        skip, self._pending_skip, self._restored_at = self._pending_skip, 0, None
        self._apply_epoch()
        self.end_of_dataloader = False
        self._observed_remainder = None
        self._yielded = skip
        observer = self.iteration_observer
        if observer is not None:
            observer.begin(self)
        # torchdata's state, taken per batch only over a StatefulDataLoader
        snapshot = self.base_dataloader.state_dict if self._is_stateful else _no_state
        try:
            batches = self._batches(skip)
            current = next(batches, _END)
            if current is _END:
                self._finish_epoch()
                return
            current_state = snapshot()
            for upcoming in batches:  # look one batch ahead to know which batch is the last
                upcoming_state = snapshot()
                self._yielded += 1
                self._base_state = current_state  # torchdata's state once `current` is consumed
                yield current
                current, current_state = upcoming, upcoming_state
            self._observed_remainder = self._final_remainder()
            self.end_of_dataloader = True
            self._yielded += 1
            self._base_state = current_state
            yield current
            self._finish_epoch()
        finally:
            if observer is not None:
                observer.end(self)

    def _batches(self, skip: int) -> Iterator[Any]:
        raise NotImplementedError

    @property
    def _is_stateful(self) -> bool:
        """The base loader is torchdata's StatefulDataLoader (its state is reported too)."""
        base = self.base_dataloader
        return type(base).__module__.startswith("torchdata.") and hasattr(base, "state_dict")

    def _final_remainder(self) -> int | None:
        """The remainder observed at the end of the epoch, None when nothing was observed."""
        return None

    def _finish_epoch(self) -> None:
        self._epoch += 1
        self._yielded = 0
        self._gen_state = None

    def _base_iterator(self, skip: int) -> Iterator[Any]:
        """Start the base loader at batch `skip` (sampler-level when it has a batch sampler)."""
        gen = getattr(self.base_dataloader, "generator", None)
        if gen is None or getattr(self, "_owns_generator", False):
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
            self._pending_gen_state = None
        self._epoch = epoch
        self._apply_epoch()

    def _apply_epoch(self) -> None:
        for target in self._epoch_targets:
            target.set_epoch(self._epoch)

    @property
    def iteration(self) -> int:
        """The current epoch (accelerate's name)."""
        return self._epoch

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

        Over torchdata's StatefulDataLoader (`use_stateful_dataloader=True`) the dict is also
        torchdata's own state dict as it was when the last batch handed out was fetched (the
        base loader runs one batch ahead); resuming uses accel's keys, which are exact.
        """
        extra: dict[str, Any] = {}
        if self._is_stateful:
            extra = dict(self._base_state or self.base_dataloader.state_dict())
        return {
            **extra,
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches_yielded": self._yielded,
            "seed": None if self._seedable is None else self._seedable.seed,
            "generator_state": None if self._gen_state is None else self._gen_state.clone(),
            "num_processes": self.num_processes,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a position: the next iteration yields exactly what an unbroken run would."""
        missing = {"epoch", "batches_yielded", "num_processes"} - set(state_dict)
        if missing:
            raise KeyError(
                f"not a data loader state dict: missing {sorted(missing)}; expected the dict "
                f"returned by state_dict() of a DataLoaderShard or DataLoaderDispatcher"
            )
        if state_dict["num_processes"] != self.num_processes:
            raise ValueError(
                f"the loader state was saved with num_processes={state_dict['num_processes']} "
                f"but this loader has num_processes={self.num_processes}; a mid-epoch position "
                f"only resumes on the same number of processes (start the epoch over instead)"
            )
        seed = state_dict.get("seed")
        if seed is not None and self._seedable is not None:
            self._seedable.seed = int(seed)
        self._epoch = int(state_dict["epoch"])
        self._yielded = self._pending_skip = int(state_dict["batches_yielded"])
        self._restored_at = self._pending_skip
        self._pending_gen_state = state_dict.get("generator_state")
        self._gen_state = self._pending_gen_state
        self._apply_epoch()

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


_END = object()
