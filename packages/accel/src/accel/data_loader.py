"""Familiar path `accelerate.data_loader`: re-exports from the packages that own the code."""

from accel._accelerator import (
    GradientState,
)
from accel._compat._imports import (
    is_datasets_available,
    is_torchdata_stateful_dataloader_available,
)
from accel._compat._operations import (
    get_data_structure,
    initialize_tensors,
    slice_tensors,
)
from accel._compat._versions import (
    compare_versions,
    is_torch_version,
)
from accel._data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    prepare_data_loader,
)
from accel._logging import (
    get_logger,
)
from accel_data import (
    BatchSamplerShard,
    DataLoaderAdapter,
    DataLoaderConfiguration,
    DataLoaderStateMixin,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    SkipDataLoader,
    get_sampler,
    skip_first_batches,
)
from accel_state import (
    DistributedType,
    PartialState,
    RNGType,
    broadcast,
    broadcast_object_list,
    concatenate,
    find_batch_size,
    send_to_device,
    synchronize_rng_states,
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

# accelerate's module binds these too; users import them from here
__all__ += [
    "DistributedType",
    "GradientState",
    "PartialState",
    "RNGType",
    "broadcast",
    "broadcast_object_list",
    "compare_versions",
    "concatenate",
    "find_batch_size",
    "get_data_structure",
    "get_logger",
    "initialize_tensors",
    "is_datasets_available",
    "is_torch_version",
    "is_torchdata_stateful_dataloader_available",
    "send_to_device",
    "slice_tensors",
    "synchronize_rng_states",
]
