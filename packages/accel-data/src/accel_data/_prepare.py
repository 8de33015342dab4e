"""prepare_data_loader: turn a user's DataLoader into this process's share of it."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accel_data._base import IterationObserver
from accel_data._dispatch import DataLoaderDispatcher
from accel_data._iterable import IterableDatasetShard
from accel_data._samplers import (
    BatchSamplerShard,
    SeedableRandomSampler,
    _check_topology,
    _ResumeBatchSampler,
)
from accel_data._shard import DataLoaderShard

# Options copied from the user's loader to the rebuilt one (when its class accepts them).
_LOADER_OPTIONS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
    "snapshot_every_n_steps",
)


def prepare_data_loader(
    dataloader: DataLoader,
    *,
    num_processes: int,
    process_index: int,
    device: torch.device | str | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    iteration_observer: IterationObserver | None = None,
    use_stateful_dataloader: bool = False,
) -> DataLoaderShard | DataLoaderDispatcher:
    """Wrap `dataloader` so that this process (`process_index` of `num_processes`) gets its share.

    Each epoch, the processes together see every sample once (map-style, or a stream cut
    into global batches), padded at the end as BatchSamplerShard / IterableDatasetShard
    describe. With `dispatch_batches`, process 0 reads and broadcasts instead (needs an
    initialized torch.distributed process group when num_processes > 1); None means "for
    iterable datasets when `put_on_device`". `put_on_device` moves every batch to `device`.

    Shuffling: a `RandomSampler` (e.g. from `DataLoader(shuffle=True)`) is replaced by a
    SeedableRandomSampler, whatever `use_seedable_sampler` says, so the order is the same on
    every process and resumable. Its base seed is `data_seed`, else the initial seed of the
    sampler's or loader's generator, else drawn once from torch's global RNG and broadcast
    from process 0 when a process group is initialized. Epoch e uses base seed + e.

    `iteration_observer`: an object with `begin(loader)` / `end(loader)`, called when an
    iteration starts and when it ends (or is closed or garbage-collected).
    `use_stateful_dataloader`: rebuild as torchdata's StatefulDataLoader.
    """
    del use_seedable_sampler  # shuffling is always seedable; kept for accelerate's signature
    _check_topology(num_processes, process_index)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader expects a torch.utils.data.DataLoader, got "
            f"{type(dataloader).__name__}"
        )
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = put_on_device and iterable
    if dispatch_batches and num_processes > 1:
        _require_process_group()
    loader_cls = _loader_class(dataloader, use_stateful_dataloader)
    common = dict(
        dataset=dataset,
        num_processes=num_processes,
        process_index=process_index,
        device=device,
        put_on_device=put_on_device,
        non_blocking=non_blocking,
        iteration_observer=iteration_observer,
    )
    if iterable:
        return _prepare_iterable(
            dataloader,
            loader_cls,
            common,
            split_batches,
            dispatch_batches,
            even_batches,
            slice_fn_for_dispatch,
        )
    if dataloader.batch_sampler is None:
        raise ValueError(
            "prepare_data_loader needs batches: this DataLoader has batch_size=None (no "
            "automatic batching). Give it a batch_size or a batch_sampler."
        )
    seedable, batch_sampler = _seedable_batches(dataloader, data_seed)
    targets = _epoch_targets(seedable, batch_sampler, dataset)
    per = getattr(batch_sampler, "batch_size", None)
    total = None if per is None else (per if split_batches else per * num_processes)
    if dispatch_batches:
        global_sampler = _global_batch_sampler(batch_sampler, split_batches, num_processes)
        resume = _ResumeBatchSampler(global_sampler)
        base = _rebuild(dataloader, loader_cls, dataset, batch_sampler=resume)
        return DataLoaderDispatcher(
            base,
            split_batches=split_batches,
            even_batches=even_batches,
            slice_fn=slice_fn_for_dispatch,
            seedable_sampler=seedable,
            resume_sampler=resume,
            epoch_targets=targets,
            total_batch_size=total,
            static_remainder=_map_remainder(batch_sampler, total),
            **common,
        )
    shard = BatchSamplerShard(
        batch_sampler, num_processes, process_index, split_batches, even_batches
    )
    resume = _ResumeBatchSampler(shard)
    base = _rebuild(dataloader, loader_cls, dataset, batch_sampler=resume)
    return DataLoaderShard(
        base,
        seedable_sampler=seedable,
        resume_sampler=resume,
        epoch_targets=targets,
        total_batch_size=total,
        static_remainder=_map_remainder(batch_sampler, total),
        **common,
    )


def _prepare_iterable(
    dataloader: DataLoader,
    loader_cls: type,
    common: dict[str, Any],
    split_batches: bool,
    dispatch_batches: bool,
    even_batches: bool,
    slice_fn: Callable[..., Any] | None,
) -> DataLoaderShard | DataLoaderDispatcher:
    dataset, p = dataloader.dataset, common["num_processes"]
    per = dataloader.batch_size
    if per is None:
        raise ValueError(
            "prepare_data_loader needs batches: this DataLoader over an iterable dataset has "
            "batch_size=None. Give it a batch_size."
        )
    drop_last = dataloader.drop_last
    total = per if split_batches else per * p
    remainder = -1
    if isinstance(dataset, Sized):
        remainder = 0 if drop_last else len(dataset) % total
    if dispatch_batches:
        base = _rebuild(dataloader, loader_cls, dataset, batch_size=total, drop_last=drop_last)
        targets = [dataset] if hasattr(dataset, "set_epoch") else []
        return DataLoaderDispatcher(
            base,
            split_batches=split_batches,
            even_batches=even_batches,
            slice_fn=slice_fn,
            seedable_sampler=None,
            resume_sampler=None,
            epoch_targets=targets,
            total_batch_size=total,
            static_remainder=remainder,
            **common,
        )
    shard = IterableDatasetShard(dataset, per, drop_last, p, common["process_index"], split_batches)
    base = _rebuild(
        dataloader, loader_cls, shard, batch_size=shard.process_batch_size, drop_last=drop_last
    )
    return DataLoaderShard(
        base,
        seedable_sampler=None,
        resume_sampler=None,
        epoch_targets=[shard],
        total_batch_size=total,
        static_remainder=remainder,
        **common,
    )


def _seedable_batches(
    dataloader: DataLoader, data_seed: int | None
) -> tuple[SeedableRandomSampler | None, Any]:
    """Replace a RandomSampler inside the batch sampler by a SeedableRandomSampler."""
    batch_sampler = dataloader.batch_sampler
    sampler = getattr(batch_sampler, "sampler", None)
    if isinstance(sampler, SeedableRandomSampler):
        if data_seed is not None:
            sampler.seed = int(data_seed)
        return sampler, batch_sampler
    if not _is_random_sampler(sampler):
        return None, batch_sampler
    seed = _base_seed(data_seed, getattr(sampler, "generator", None) or dataloader.generator)
    seedable = SeedableRandomSampler(
        sampler.data_source,
        getattr(sampler, "replacement", False),
        getattr(sampler, "_num_samples", None),
        seed=seed,
    )
    if _is_plain(batch_sampler, BatchSampler):
        return seedable, BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last)
    batch_sampler = copy.copy(batch_sampler)
    batch_sampler.sampler = seedable
    return seedable, batch_sampler


def _is_plain(obj: Any, cls: type) -> bool:
    """`obj` is a `cls`, or torchdata's stateful copy of it (whose state we replace)."""
    kind = type(obj)
    return kind is cls or (
        kind.__name__ == cls.__name__ and kind.__module__.startswith("torchdata.")
    )


def _is_random_sampler(sampler: Any) -> bool:
    return isinstance(sampler, RandomSampler) or _is_plain(sampler, RandomSampler)


def _base_seed(data_seed: int | None, generator: torch.Generator | None) -> int:
    if data_seed is not None:
        return int(data_seed)
    if generator is not None:
        return int(generator.initial_seed())
    seed = int(torch.randint(0, 2**62, ()).item())
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = int(box[0])
    return seed


def _epoch_targets(seedable: Any, batch_sampler: Any, dataset: Any) -> list[Any]:
    """Every distinct object that wants to hear the epoch."""
    targets: list[Any] = []
    for obj in (seedable, getattr(batch_sampler, "sampler", None), batch_sampler, dataset):
        if obj is not None and hasattr(obj, "set_epoch") and all(obj is not t for t in targets):
            targets.append(obj)
    return targets


def _global_batch_sampler(batch_sampler: Any, split_batches: bool, num_processes: int) -> Any:
    """The batch sampler process 0 reads in dispatch mode: one global batch at a time."""
    if split_batches or num_processes == 1:
        return batch_sampler
    if not _is_plain(batch_sampler, BatchSampler):
        raise ValueError(
            f"dispatch_batches=True with split_batches=False rebuilds the batch sampler with "
            f"batch_size * num_processes, which needs a torch BatchSampler; got "
            f"{type(batch_sampler).__name__}. Pass split_batches=True (its batches are then "
            f"the global batches) or dispatch_batches=False."
        )
    return BatchSampler(
        batch_sampler.sampler, batch_sampler.batch_size * num_processes, batch_sampler.drop_last
    )


def _map_remainder(batch_sampler: Any, total: int | None) -> int:
    if getattr(batch_sampler, "drop_last", False):
        return 0
    sampler = getattr(batch_sampler, "sampler", None)
    if total is None or not isinstance(sampler, Sized):
        return -1
    return len(sampler) % total


def _loader_class(dataloader: DataLoader, use_stateful: bool) -> type:
    if use_stateful:
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError as err:
            raise ImportError(
                "use_stateful_dataloader=True needs torchdata: pip install torchdata"
            ) from err
        return StatefulDataLoader
    if hasattr(dataloader, "state_dict") and hasattr(dataloader, "load_state_dict"):
        return type(dataloader)  # a StatefulDataLoader the user brought
    return DataLoader


def _rebuild(dataloader: DataLoader, cls: type, dataset: Any, **overrides: Any) -> DataLoader:
    accepted = inspect.signature(cls.__init__).parameters
    options = {
        name: getattr(dataloader, name)
        for name in _LOADER_OPTIONS
        if name in accepted and hasattr(dataloader, name)
    }
    if options.get("num_workers", 0) == 0:
        options.pop("prefetch_factor", None)
        options["persistent_workers"] = False
    return cls(dataset, **options, **overrides)


def _require_process_group() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "dispatch_batches=True with num_processes > 1 broadcasts batches over "
            "torch.distributed, but no process group is initialized. Call "
            "torch.distributed.init_process_group() first, or use dispatch_batches=False."
        )
