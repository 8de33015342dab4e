"""prepare_data_loader: turn a user's DataLoader into this process's share of it."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accel_data._adapters import is_stateful_loader, stateful_loader_class
from accel_data._base import IterationObserver, _epoch_targets
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
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    *,
    iteration_observer: IterationObserver | None = None,
    shard_class: type[DataLoaderShard] = DataLoaderShard,
    dispatcher_class: type[DataLoaderDispatcher] = DataLoaderDispatcher,
) -> DataLoaderShard | DataLoaderDispatcher:
    """Wrap `dataloader` so that this process (`process_index` of `num_processes`) gets its share.

    Each epoch, the processes together see every sample once (map-style, or a stream cut
    into global batches), padded at the end as BatchSamplerShard / IterableDatasetShard
    describe. With `dispatch_batches`, process 0 reads and broadcasts instead (needs an
    initialized torch.distributed process group when num_processes > 1); None means "for
    iterable datasets when `put_on_device`". `put_on_device` moves every batch to `device`.
    `num_processes` / `process_index` default to the initialized torch.distributed process
    group (else one process); with `torch_device_mesh`, processes of one tensor- or
    context-parallel group (mesh dimensions "tp", "cp") read the same batches.

    Shuffling (a `RandomSampler`, e.g. from `DataLoader(shuffle=True)`):
    - by default each epoch's order is drawn from the sampler's generator when the epoch
      starts, as torch draws it, so reseeding that generator (`DataLoader(generator=g)`)
      between epochs changes the order as it would without accel. A sampler without a
      generator gets one, seeded from torch's global RNG. With several processes, process
      0's generator state is sent to the others at each epoch start (torch.distributed), so
      every process draws the same order. The generator's state at the epoch start is part
      of `state_dict()`, so a resumed epoch replays the same order.
    - `use_seedable_sampler=True`, or a `data_seed` given: a SeedableRandomSampler instead, whose epoch e uses base
      seed + e: the base seed is `data_seed`, else the initial seed of the sampler's or
      loader's generator, else drawn once from torch's global RNG and broadcast from
      process 0 when a process group is initialized.

    `iteration_observer`: an object with `begin(loader)` / `end(loader)`, called when an
    iteration starts and when it ends (or is closed or garbage-collected). `rng_types` is
    kept on the loader for the caller that synchronizes random states at each epoch.
    `use_stateful_dataloader`: rebuild as torchdata's StatefulDataLoader.
    `shard_class` / `dispatcher_class`: subclasses to build instead (a framework's own).
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader expects a torch.utils.data.DataLoader, got "
            f"{type(dataloader).__name__}"
        )
    num_processes, process_index = _topology(num_processes, process_index, torch_device_mesh)
    _check_topology(num_processes, process_index)
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = put_on_device and iterable
    if dispatch_batches and num_processes > 1:
        _require_process_group()
    stateful = use_stateful_dataloader or is_stateful_loader(dataloader)
    build = dict(
        _loader_options(dataloader, stateful),
        use_stateful_dataloader=stateful,
        _non_blocking=non_blocking,
        torch_device_mesh=torch_device_mesh,
    )
    common = dict(
        dataset=dataset,
        num_processes=num_processes,
        process_index=process_index,
        put_on_device=put_on_device,
        iteration_observer=iteration_observer,
    )
    if iterable:
        loader = _prepare_iterable(
            dataloader, build, common, split_batches, dispatch_batches, even_batches,
            slice_fn_for_dispatch, device, rng_types, (shard_class, dispatcher_class),
        )  # fmt: skip
        return loader
    source = dataloader.batch_sampler
    # A BatchSampler given as `sampler` (batch_size=None): each index is already a batch.
    as_sampler = source is None and isinstance(dataloader.sampler, BatchSampler)
    if as_sampler:
        source = dataloader.sampler
    if source is None:
        raise ValueError(
            "prepare_data_loader needs batches: this DataLoader has batch_size=None (no "
            "automatic batching). Give it a batch_size or a batch_sampler."
        )
    seedable_order = bool(use_seedable_sampler) or data_seed is not None
    seedable, batch_sampler = _seedable_batches(dataloader, source, data_seed, seedable_order)
    order_generator = None
    if not isinstance(seedable, SeedableRandomSampler):
        order_generator, seedable = getattr(seedable, "generator", None), None
    targets = _epoch_targets(seedable, batch_sampler, dataset)
    per = getattr(batch_sampler, "batch_size", None)
    total = None if per is None else (per if split_batches else per * num_processes)
    sizes = dict(
        seedable_sampler=seedable,
        order_generator=order_generator,
        epoch_targets=targets,
        total_batch_size=total,
        static_remainder=_map_remainder(batch_sampler, total),
    )
    if dispatch_batches:
        global_sampler = _global_batch_sampler(batch_sampler, split_batches, num_processes)
        resume = _ResumeBatchSampler(global_sampler)
        loader = dispatcher_class(
            dataset,
            split_batches=split_batches,
            even_batches=even_batches,
            slice_fn=slice_fn_for_dispatch,
            **_index_source(resume, as_sampler),
            **build,
        )
        loader.device = None if device is None else torch.device(device)
        loader._configure(resume_sampler=resume, **sizes, **common)
        return loader
    shard = BatchSamplerShard(
        batch_sampler, num_processes, process_index, split_batches, even_batches
    )
    resume = _ResumeBatchSampler(shard)
    loader = shard_class(
        dataset, device=device, rng_types=rng_types, **_index_source(resume, as_sampler), **build
    )
    loader._configure(resume_sampler=resume, **sizes, **common)
    return loader


def _index_source(resume: _ResumeBatchSampler, as_sampler: bool) -> dict[str, Any]:
    """How the rebuilt loader takes its index batches: as its batch sampler, or as its
    sampler without automatic batching (when the user's loader took them that way)."""
    if as_sampler:
        return {"sampler": resume, "batch_size": None}
    return {"batch_sampler": resume}


def _topology(num_processes: int | None, process_index: int | None, mesh: Any) -> tuple[int, int]:
    """The data-parallel (world size, rank): explicit values, else the process group's."""
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized()
    if num_processes is None:
        num_processes = dist.get_world_size() if group else 1
    if process_index is None:
        process_index = dist.get_rank() if group else 0
    if mesh is None:
        return num_processes, process_index
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    shared = 1  # processes that read the same batches (tensor / context parallel)
    for name in ("tp", "cp"):
        if name in names:
            shared *= mesh[name].size()
    return num_processes // shared, process_index // shared


def _prepare_iterable(
    dataloader: DataLoader,
    build: dict[str, Any],
    common: dict[str, Any],
    split_batches: bool,
    dispatch_batches: bool,
    even_batches: bool,
    slice_fn: Callable[..., Any] | None,
    device: torch.device | str | None,
    rng_types: list[Any] | None,
    classes: tuple[type[DataLoaderShard], type[DataLoaderDispatcher]],
) -> DataLoaderShard | DataLoaderDispatcher:
    dataset, p = dataloader.dataset, common["num_processes"]
    per = dataloader.batch_size  # None: the stream yields whole batches itself
    drop_last = dataloader.drop_last
    total = None if per is None else (per if split_batches else per * p)
    remainder = -1
    if isinstance(dataset, Sized) and total is not None:
        remainder = 0 if drop_last else len(dataset) % total
    if dispatch_batches:
        if per is None and p > 1:
            raise ValueError(
                "dispatch_batches=True slices each batch across processes, but this "
                "DataLoader has batch_size=None. Give it a batch_size, or use "
                "dispatch_batches=False (each process then takes whole items in turn)."
            )
        loader = classes[1](
            dataset,
            split_batches=split_batches,
            even_batches=even_batches,
            slice_fn=slice_fn,
            batch_size=total,
            drop_last=drop_last,
            _drop_last=drop_last,
            **build,
        )
        loader.device = None if device is None else torch.device(device)
        targets = [dataset] if hasattr(dataset, "set_epoch") else []
        shard = None
    else:
        shard = IterableDatasetShard(
            dataset, per or 1, drop_last, p, common["process_index"], bool(split_batches and per)
        )
        batch = None if per is None else shard.process_batch_size
        loader = classes[0](
            shard,
            device=device,
            rng_types=rng_types,
            batch_size=batch,
            drop_last=drop_last,
            _drop_last=drop_last,
            **build,
        )
        targets = [shard]
    loader._configure(
        seedable_sampler=None,
        order_generator=None,
        resume_sampler=None,
        epoch_targets=targets,
        total_batch_size=total,
        static_remainder=remainder,
        **common,
    )
    return loader


def _seedable_batches(
    dataloader: DataLoader, batch_sampler: Any, data_seed: int | None, seedable_order: bool
) -> tuple[RandomSampler | None, Any]:
    """The random sampler inside the batch sampler, made resumable: a SeedableRandomSampler
    (`seedable_order`), else a copy of the user's sampler drawing from a generator of its own
    (the user's, when it has one); and the batch sampler that iterates it."""
    inner = getattr(batch_sampler, "batch_sampler", None)
    if inner is not None:  # a wrapper that iterates another batch sampler (SkipBatchSampler)
        seedable, new_inner = _seedable_batches(dataloader, inner, data_seed, seedable_order)
        if new_inner is not inner:
            batch_sampler = copy.copy(batch_sampler)
            batch_sampler.batch_sampler = new_inner
            batch_sampler.sampler = getattr(new_inner, "sampler", None)
        return seedable, batch_sampler
    sampler = getattr(batch_sampler, "sampler", None)
    if isinstance(sampler, SeedableRandomSampler):
        if data_seed is not None:
            sampler.seed = int(data_seed)
        return sampler, batch_sampler
    if not _is_random_sampler(sampler):
        return None, batch_sampler
    if seedable_order:
        seed = _base_seed(data_seed, getattr(sampler, "generator", None) or dataloader.generator)
        seedable = SeedableRandomSampler(
            sampler.data_source,
            getattr(sampler, "replacement", False),
            getattr(sampler, "_num_samples", None),
            seed=seed,
        )
    else:
        seedable = _generator_sampler(sampler)
    if _is_plain(batch_sampler, BatchSampler):
        return seedable, BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last)
    batch_sampler = copy.copy(batch_sampler)
    batch_sampler.sampler = seedable
    return seedable, batch_sampler


def _generator_sampler(sampler: Any) -> RandomSampler:
    """A copy of a random sampler that draws each epoch's order from a generator it keeps:
    the sampler's own, else a new one seeded from torch's global RNG. torchdata's stateful
    RandomSampler (which draws its order when iterated, not when read) becomes torch's, with
    the same generator: the prepared loader keeps the position itself."""
    if _is_plain(sampler, RandomSampler) and not isinstance(sampler, RandomSampler):
        copied = RandomSampler(
            sampler.data_source,
            sampler.replacement,
            sampler._num_samples,
            generator=sampler.generator,
        )
    else:
        copied = copy.copy(sampler)
    if getattr(copied, "generator", None) is None:
        copied.generator = torch.Generator()
        copied.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return copied


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


def _loader_options(dataloader: DataLoader, stateful: bool) -> dict[str, Any]:
    """The options of `dataloader` that the rebuilt base loader takes over."""
    cls = stateful_loader_class() if stateful else DataLoader
    accepted = inspect.signature(cls.__init__).parameters
    options = {
        name: getattr(dataloader, name)
        for name in _LOADER_OPTIONS
        if name in accepted and hasattr(dataloader, name)
    }
    if options.get("num_workers", 0) == 0:
        options.pop("prefetch_factor", None)
        options["persistent_workers"] = False
    return options


def _require_process_group() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "dispatch_batches=True with num_processes > 1 broadcasts batches over "
            "torch.distributed, but no process group is initialized. Call "
            "torch.distributed.init_process_group() first, or use dispatch_batches=False."
        )
