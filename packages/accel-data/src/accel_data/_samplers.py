"""Samplers: a shuffle that is a pure function of (seed, epoch), a per-process batch shard, and
the batch sampler that starts an epoch at a given batch.

Both work on indices only, in the main process, so skipping batches to resume an epoch never
reads a sample, with or without worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler


class SeedableRandomSampler(RandomSampler):
    """A `RandomSampler` whose order for epoch `e` depends only on `seed + e`.

    Every rank builds the same permutation from the same seed, with no RNG synchronization,
    and a restarted process rebuilds it from the saved (seed, epoch): that is what makes a
    shuffled epoch exactly resumable. The seed is `seed` (or `data_seed`, accelerate's name),
    else torch's initial seed (`torch.initial_seed()`, what `set_seed` sets). Each epoch
    reseeds the generator (`generator`, else one of its own) with seed + epoch and draws as
    `RandomSampler` does; a full pass moves to the next epoch, as `set_epoch` does. The
    global torch RNG is never touched.
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement, num_samples, generator)
        if seed is None:
            seed = torch.initial_seed() if data_seed is None else data_seed
        self.seed = int(seed)
        self.epoch = 0

    @property
    def initial_seed(self) -> int:
        """The base seed (accelerate's name for `seed`)."""
        return self.seed

    @initial_seed.setter
    def initial_seed(self, value: int) -> None:
        self.seed = int(value)

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of `epoch` (the next iteration uses seed + epoch)."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)


class BatchSamplerShard(BatchSampler):
    """The batches of one process out of a batch sampler that every process iterates alike.

    Without `split_batches`, process `i` gets batches i, i+P, i+2P, ... (a global batch is P
    consecutive batches). With `split_batches`, every batch is cut into P equal slices and
    process `i` gets slice i (the batch size must divide by P).

    The final, incomplete global batch:
    - `drop_last` (of the wrapped batch sampler): dropped, every process gets the same count;
    - `even_batches=True`: completed by cycling through the first indices of the epoch, so
      every process gets the same number of full batches; the duplicates come last (one
      process keeps its short batch: nothing needs evening, as with accelerate);
    - `even_batches=False`: left short; some processes get one batch fewer (see `__len__`).

    `last_round_real` is the number of real (not padded) indices in the final global batch of
    the last finished iteration, 0 when that batch was complete.
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        _check_topology(num_processes, process_index)
        batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches:
            if batch_size is None:
                raise ValueError(
                    f"split_batches=True needs a batch sampler with a fixed `batch_size`; "
                    f"{type(batch_sampler).__name__} has none. Use split_batches=False."
                )
            if batch_size % num_processes != 0:
                raise ValueError(
                    f"split_batches=True: batch size {batch_size} does not divide across "
                    f"{num_processes} processes. Use a batch size that is a round multiple of "
                    f"{num_processes}, or split_batches=False."
                )
        self.batch_sampler = batch_sampler
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.batch_size = batch_size
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.last_round_real = -1

    def __len__(self) -> int:
        m, p, i = len(self.batch_sampler), self.num_processes, self.process_index
        if self.split_batches:
            if self.even_batches or self.drop_last:
                return m
            short = len(self.sampler) % self.batch_size if isinstance(self.sampler, Sized) else 0
            if short == 0:
                return m
            return m - 1 + int(i * (self.batch_size // p) < short)
        if self.drop_last:
            return m // p
        if self.even_batches:
            return -(-m // p)
        return m // p + int(i < m % p)

    def __iter__(self) -> Iterator[list[int]]:
        if self.split_batches:
            return self._iter_split()
        return self._iter_rounds()

    def _iter_rounds(self) -> Iterator[list[int]]:
        p, me, size = self.num_processes, self.process_index, self.batch_size
        first: list[list[int]] = []
        pending: list[list[int]] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            if len(pending) == p:  # a round held for its short batch was not the last one
                yield pending[me]
                pending = []
            if len(first) < p:
                first.append(batch)
            pending.append(batch)
            if len(pending) == p and (size is None or len(batch) == size):
                yield pending[me]
                pending = []
        if not pending:
            self.last_round_real = 0
            return
        self.last_round_real = sum(len(b) for b in pending)
        if self.drop_last:
            self.last_round_real = 0
            return
        if not self.even_batches or p == 1:  # one process: its short batch is already even
            if me < len(pending):
                yield pending[me]
            return
        yield self._complete_round(pending, first)[me]

    def _complete_round(self, pending: list[list[int]], first: list[list[int]]) -> list[list[int]]:
        """Fill the final round up to P full batches, cycling through the epoch's first indices."""
        size = self.batch_size
        flat = [i for b in first for i in b]
        cursor = 0

        def take(n: int) -> list[int]:
            nonlocal cursor
            out = [flat[(cursor + k) % len(flat)] for k in range(n)]
            cursor += n
            return out

        batches = []
        for j in range(self.num_processes):
            if j < len(pending):
                batch = pending[j]
                if size is not None and len(batch) < size:
                    batch = batch + take(size - len(batch))
            elif size is not None:
                batch = take(size)
            else:  # batches of varying size: repeat whole batches from the start
                batch = first[(j - len(pending)) % len(first)]
            batches.append(batch)
        return batches

    def _iter_split(self) -> Iterator[list[int]]:
        size, p, me = self.batch_size, self.num_processes, self.process_index
        part = size // p
        mine = slice(me * part, (me + 1) * part)
        first: list[int] | None = None
        self.last_round_real = 0
        for batch in self.batch_sampler:
            batch = list(batch)
            if first is None:
                first = batch
            if len(batch) == size:
                yield batch[mine]
                continue
            if len(batch) > size:
                raise ValueError(
                    f"split_batches=True: the batch sampler yielded a batch of {len(batch)} "
                    f"indices, more than its batch_size {size}."
                )
            self.last_round_real = len(batch)
            if self.even_batches and p > 1:
                batch = batch + [first[k % len(first)] for k in range(size - len(batch))]
            if batch[mine]:
                yield batch[mine]


class _ResumeBatchSampler(Sampler):
    """Drops the first `skip` index batches of each iteration (the owner resets `skip`).

    `skip` is not reset here: a DataLoader with workers iterates its batch sampler twice
    while it starts, and both iterators must skip. Each iterator reads `skip` when it is made
    but draws nothing until it is advanced, so the iterator the DataLoader leaves unused does
    not move a shuffling sampler's generator.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.skip = 0

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        return self._iterate(self.skip)

    def _iterate(self, skip: int) -> Iterator[list[int]]:
        it = iter(self.batch_sampler)
        for _ in range(skip):
            if next(it, None) is None:
                return
        yield from it


def _check_topology(num_processes: int, process_index: int) -> None:
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
    if not isinstance(process_index, int) or not 0 <= process_index < num_processes:
        raise ValueError(
            f"process_index must be an int in [0, {num_processes}), got {process_index!r}"
        )
