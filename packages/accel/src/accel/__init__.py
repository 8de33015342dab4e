"""accel: one PyTorch training loop on a CPU, one GPU, many GPUs or many machines.

The composition root of the workspace: `Accelerator` and the familiar top-level names,
re-exported from the packages that own them.
"""

from accel._accelerator import Accelerator
from accel._accelerator_state import AcceleratorState
from accel._as_accelerate import use_as_accelerate
from accel._compat._imports import is_rich_available
from accel._config import ProfileKwargs, ProjectConfiguration
from accel._dynamo import TorchDynamoPlugin
from accel._gradient_state import GradientAccumulationPlugin, GradientState
from accel._launchers import debug_launcher, notebook_launcher
from accel._memory import find_executable_batch_size, release_memory
from accel._pippy import prepare_pippy
from accel._wrappers import AcceleratedOptimizer, AcceleratedScheduler
from accel_bigmodel import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from accel_data import DataLoaderConfiguration, skip_first_batches
from accel_parallel import (
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
)
from accel_parallel.familiar import (
    ParallelismConfig,
)
from accel_precision import (
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
)
from accel_state import (
    DistributedType,
    InitProcessGroupKwargs,
    PartialState,
    synchronize_rng_states,
)

__version__ = "0.1.0"

__all__ = [
    "AORecipeKwargs",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "ParallelismConfig",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
    "cpu_offload",
    "cpu_offload_with_hook",
    "debug_launcher",
    "disk_offload",
    "dispatch_model",
    "find_executable_batch_size",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "is_rich_available",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "notebook_launcher",
    "prepare_pippy",
    "release_memory",
    "skip_first_batches",
    "synchronize_rng_states",
    "use_as_accelerate",
]
