"""accel-data: shard any PyTorch DataLoader across processes, and resume it exactly mid-epoch.

Needs only torch. The caller says who it is (`num_processes`, `process_index`, `device`);
nothing is read from the environment. Importing this package does nothing.
"""

from accel_data._adapters import (
    DataLoaderAdapter,
    DataLoaderStateMixin,
    SkipBatchSampler,
    SkipDataLoader,
    get_sampler,
)
from accel_data._base import IterationObserver
from accel_data._config import DataLoaderConfiguration
from accel_data._dispatch import DataLoaderDispatcher
from accel_data._iterable import IterableDatasetShard
from accel_data._ops import find_batch_size, send_to_device
from accel_data._prepare import prepare_data_loader
from accel_data._resume import continue_data_position
from accel_data._samplers import BatchSamplerShard, SeedableRandomSampler
from accel_data._shard import DataLoaderShard
from accel_data._skip import skip_first_batches

__version__ = "0.1.0"

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "IterationObserver",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "continue_data_position",
    "find_batch_size",
    "get_sampler",
    "prepare_data_loader",
    "send_to_device",
    "skip_first_batches",
]
