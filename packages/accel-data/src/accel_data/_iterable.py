"""IterableDatasetShard: one process's share of a stream that every process reads in full."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import IterableDataset

from accel_data._samplers import _check_topology


class IterableDatasetShard(IterableDataset):
    """Cut a stream into global batches and keep this process's slice of each.

    Every process iterates the whole `dataset`, groups it into global batches of
    `batch_size * num_processes` samples (`batch_size` with `split_batches`) and yields its
    own `batch_size` (or `batch_size // num_processes`) samples of each. The final, short
    global batch is dropped with `drop_last`, else completed by cycling through the first
    samples of the stream, so every process yields the same number of samples (one process
    keeps the short batch: there is nothing to even out).

    The length of a stream is often unknown, so the remainder is found at its end:
    `last_batch_real` holds the number of real samples in the final global batch of the last
    finished iteration (0 when it was complete), readable in the process that iterated it.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        _check_topology(num_processes, process_index)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if split_batches and batch_size % num_processes != 0:
            raise ValueError(
                f"split_batches=True: batch size {batch_size} does not divide across "
                f"{num_processes} processes. Use a round multiple of {num_processes}, or "
                f"split_batches=False."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0
        self.last_batch_real = -1

    @property
    def total_batch_size(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        return self.total_batch_size // self.num_processes

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and pass it on to the wrapped dataset when it accepts one."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError(f"{type(self.dataset).__name__} has no length")
        full, rest = divmod(len(self.dataset), self.total_batch_size)
        if self.num_processes == 1 and not self.drop_last:
            return len(self.dataset)
        batches = full if self.drop_last or rest == 0 else full + 1
        return batches * self.process_batch_size

    def __iter__(self) -> Iterator[Any]:
        total, part = self.total_batch_size, self.process_batch_size
        mine = slice(self.process_index * part, (self.process_index + 1) * part)
        first: list[Any] | None = None
        buffer: list[Any] = []
        for sample in self.dataset:
            buffer.append(sample)
            if len(buffer) == total:
                yield from buffer[mine]
                if first is None:
                    first = buffer
                buffer = []
        self.last_batch_real = len(buffer) if not self.drop_last else 0
        if self.drop_last or not buffer:
            return
        if self.num_processes == 1:  # nothing to even out: the short batch stays short
            yield from buffer
            return
        seed = first if first is not None else list(buffer)
        k = 0
        while len(buffer) < total:
            buffer.append(seed[k % len(seed)])
            k += 1
        yield from buffer[mine]
