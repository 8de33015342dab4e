"""Familiar path `accelerate.data_loader`: re-exports from the packages that own the code."""

from accel_data import (
    BatchSamplerShard,
    DataLoaderAdapter,
    DataLoaderConfiguration,
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    SkipDataLoader,
    get_sampler,
    prepare_data_loader,
    skip_first_batches,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]
