"""DataLoaderDispatcher: process 0 reads each global batch and every process gets its slice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from accel_data._base import _END, _PreparedLoader, _remainder
from accel_data._device_kinds import is_host, nccl_device
from accel_data._ops import find_batch_size, flatten, send_to_device, slice_tensors, unflatten


class DataLoaderDispatcher(_PreparedLoader):
    """A prepared loader where only process 0 reads data (made by prepare_data_loader).

    Process 0 iterates the base loader (global batches), and broadcasts each batch (nested
    dicts, lists, tuples of tensors; other leaves travel pickled) over the initialized
    torch.distributed process group; every process keeps its slice along the first
    dimension. Useful for streams that cannot be sharded, or expensive to read on every
    process. A short final batch is padded to a multiple of the number of processes with
    samples from the start of the epoch (`even_batches=True`), or split unevenly (some
    processes then get no final batch). The remainder is always known here: process 0 sees
    how many real samples the final batch has.

    Same trainer interface as DataLoaderShard: set_epoch, end_of_dataloader, remainder,
    total_batch_size, total_dataset_length, state_dict / load_state_dict,
    iteration_observer, dataset, batch_sampler, device.
    """

    _sync_order = False  # only process 0 draws the order

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., Any] | None = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        even_batches: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset,
            skip_batches=skip_batches,
            use_stateful_dataloader=use_stateful_dataloader,
            _drop_last=_drop_last,
            _non_blocking=_non_blocking,
            torch_device_mesh=torch_device_mesh,
            iteration=iteration,
            **kwargs,
        )
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.slice_fn = slice_fn
        self._last_real = -1
        # Built directly, it serves the initialized process group (else one process); with
        # split_batches=False, process 0 reads one base batch per process for each step.
        self.num_processes, self.process_index = _world()
        self._group = 1 if split_batches else self.num_processes
        if self._total_batch_size is not None:
            self._total_batch_size *= self._group
        self._static_remainder = _remainder(dataset, self._total_batch_size, self._drop_last)

    def _configure(self, **kwargs: Any) -> None:
        super()._configure(**kwargs)
        self._group = 1  # prepare_data_loader's base loader yields global batches

    def __len__(self) -> int:
        return -(-len(self.base_dataloader) // self._group)

    @property
    def batch_sampler(self) -> Any:
        """The global batch sampler iterated by process 0 (None for an iterable dataset)."""
        if self._resume is not None:
            return self._resume.batch_sampler
        if isinstance(self.base_dataloader.dataset, IterableDataset):
            return None
        return self.base_dataloader.batch_sampler

    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this process (the final batch may have fewer)."""
        total = self._total_batch_size
        return None if total is None else total // self.num_processes

    def _final_remainder(self) -> int | None:
        return self._last_real

    def _batches(self, skip: int) -> Iterator[Any]:
        reader = self._base_iterator(skip * self._group) if self.process_index == 0 else None
        first: Any = None
        while True:
            batch, real = self._next_global(reader, first)
            if batch is _END:
                return
            if first is None:
                first = batch
            total = self._total_batch_size
            self._last_real = real if total is None or real < total else 0
            mine = self._slice(batch, real)
            if mine is not None:
                yield send_to_device(mine, self.device, self.non_blocking) if self._place else mine

    def _next_global(self, reader: Iterator[Any] | None, first: Any) -> tuple[Any, int]:
        """Process 0 reads and pads a batch; every process receives (batch, real samples)."""
        if reader is not None:
            batch = _read_group(reader, self._group)
            real = -1
            if batch is not _END:
                real = find_batch_size(batch) or 0
                batch = self._pad(batch, real, first)
        else:
            batch, real = None, -1
        if self.num_processes == 1:
            return batch, real
        return _broadcast_batch(batch, real, self.device)

    def _pad(self, batch: Any, real: int, first: Any) -> Any:
        """Pad a short batch to a multiple of the process count with the epoch's first samples."""
        missing = -real % self.num_processes
        if not self.even_batches or missing == 0:
            return batch
        donor = batch if first is None else first
        donor_size = find_batch_size(donor) or 1
        index = torch.arange(missing) % donor_size
        skeleton, tensors = flatten(batch)
        _, extra = flatten(slice_tensors(donor, index))
        joined = [torch.cat([t, e]) if t.dim() > 0 else t for t, e in zip(tensors, extra)]
        return unflatten(skeleton, joined)

    def _slice(self, batch: Any, real: int) -> Any:
        size = find_batch_size(batch) or 0
        per = -(-size // self.num_processes)
        start = self.process_index * per
        if start >= size and size > 0:
            return None  # uneven final batch: nothing left for this process
        part = slice(start, start + per)
        if self.slice_fn is not None:
            return self.slice_fn(
                batch, part, process_index=self.process_index, num_processes=self.num_processes
            )
        return slice_tensors(batch, part)


def _world() -> tuple[int, int]:
    """(world size, rank) of the initialized process group, else (1, 0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _read_group(reader: Iterator[Any], group: int) -> Any:
    """The next `group` batches of `reader` joined along the first dimension (_END at the end)."""
    batches = []
    for _ in range(group):
        batch = next(reader, _END)
        if batch is _END:
            break
        batches.append(batch)
    if not batches:
        return _END
    if len(batches) == 1:
        return batches[0]
    skeleton, _ = flatten(batches[0])
    parts = [flatten(b)[1] for b in batches]
    joined = [torch.cat(ts) if ts[0].dim() > 0 else ts[0] for ts in zip(*parts)]
    return unflatten(skeleton, joined)


def _comm_device(device: torch.device | None) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return nccl_device(device)
    return torch.device("cpu")


def _broadcast_batch(batch: Any, real: int, device: torch.device | None) -> tuple[Any, int]:
    """Broadcast a nested batch from process 0: a pickled skeleton, then one buffer per dtype."""
    import torch.distributed as dist

    comm = _comm_device(device)
    if dist.get_rank() == 0:
        if batch is _END:
            meta: list[Any] = [None]
        else:
            skeleton, tensors = flatten(batch)
            specs = [(tuple(t.shape), t.dtype) for t in tensors]
            meta = [(skeleton, specs, real)]
    else:
        meta, tensors = [None], []
    dist.broadcast_object_list(meta, src=0, device=None if is_host(comm) else comm)
    if meta[0] is None:
        return _END, -1
    skeleton, specs, real = meta[0]
    received: list[torch.Tensor | None] = [None] * len(specs)
    for dtype in dict.fromkeys(dtype for _, dtype in specs):
        slots = [i for i, (_, dt) in enumerate(specs) if dt == dtype]
        wire = torch.uint8 if dtype == torch.bool else dtype
        numels = [torch.Size(specs[i][0]).numel() for i in slots]
        if dist.get_rank() == 0:
            flat = torch.cat([tensors[i].reshape(-1).to(comm, wire) for i in slots])
        else:
            flat = torch.empty(sum(numels), dtype=wire, device=comm)
        dist.broadcast(flat, src=0)
        for i, piece in zip(slots, flat.split(numels)):
            received[i] = piece.view(specs[i][0]).to(dtype)
    return unflatten(skeleton, received), real
