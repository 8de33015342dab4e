"""accel: one PyTorch training loop on a CPU, one GPU, many GPUs or many machines.

The composition root of the workspace: `Accelerator` and the familiar top-level names,
re-exported from the packages that own them.
"""

from typing import TYPE_CHECKING, Any

from accel._accelerator import Accelerator

# Every other name is imported on first use (PEP 562), so that `from accel import Accelerator`
# loads only what the Accelerator needs. `from accel import X` and `accel.X` work as before.
_LAZY = {
    "AcceleratorState": "accel._accelerator_state",
    "use_as_accelerate": "accel._as_accelerate",
    "is_rich_available": "accel._compat._imports",
    "ProfileKwargs": "accel._config",
    "ProjectConfiguration": "accel._config",
    "TorchDynamoPlugin": "accel._dynamo",
    "GradientAccumulationPlugin": "accel._gradient_state",
    "GradientState": "accel._gradient_state",
    "debug_launcher": "accel._launchers",
    "notebook_launcher": "accel._launchers",
    "find_executable_batch_size": "accel._memory",
    "release_memory": "accel._memory",
    "prepare_pippy": "accel._pippy",
    "StepMetricsKwargs": "accel._config",
    "AcceleratedOptimizer": "accel._wrappers",
    "AcceleratedScheduler": "accel._wrappers",
    "cpu_offload": "accel_bigmodel",
    "cpu_offload_with_hook": "accel_bigmodel",
    "disk_offload": "accel_bigmodel",
    "dispatch_model": "accel_bigmodel",
    "infer_auto_device_map": "accel_bigmodel",
    "init_empty_weights": "accel_bigmodel",
    "init_on_device": "accel_bigmodel",
    "load_checkpoint_and_dispatch": "accel_bigmodel",
    "load_checkpoint_in_model": "accel_bigmodel",
    "DataLoaderConfiguration": "accel_data",
    "skip_first_batches": "accel_data",
    "DDPCommunicationHookType": "accel_parallel",
    "DeepSpeedPlugin": "accel_parallel",
    "DistributedDataParallelKwargs": "accel_parallel",
    "FullyShardedDataParallelPlugin": "accel_parallel",
    "ParallelismConfig": "accel_parallel.familiar",
    "AORecipeKwargs": "accel_precision",
    "AutocastKwargs": "accel_precision",
    "FP8RecipeKwargs": "accel_precision",
    "GradScalerKwargs": "accel_precision",
    "TERecipeKwargs": "accel_precision",
    "DistributedType": "accel_state",
    "InitProcessGroupKwargs": "accel_state",
    "PartialState": "accel_state",
    "synchronize_rng_states": "accel_state",
}

if TYPE_CHECKING:
    from accel._accelerator_state import AcceleratorState
    from accel._as_accelerate import use_as_accelerate
    from accel._compat._imports import is_rich_available
    from accel._config import ProfileKwargs, ProjectConfiguration, StepMetricsKwargs
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
    from accel_parallel.familiar import ParallelismConfig
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'accel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "StepMetricsKwargs",
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
