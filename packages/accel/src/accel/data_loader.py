"""Familiar path `accelerate.data_loader`: re-exports from accel-data."""

from accel_data import (
    BatchSamplerShard,
    DataLoaderConfiguration,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
    skip_first_batches,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "prepare_data_loader",
    "skip_first_batches",
]
