"""accel-parallel: training strategies that wrap a model and its optimizer.

One small object per backend behind `Strategy` (single device, DDP, FSDP2, DeepSpeed ZeRO,
the pipeline / tensor-parallel / FSDP2 mesh of a `ParallelismConfig`, and XLA devices
through torch-xla), each registered by
name (`register_strategy`); `resolve_strategy` picks one once, from every source of
configuration.
"""

from typing import TYPE_CHECKING, Any

# Every name is imported on first use (PEP 562): the engine modules (DeepSpeed, FSDP2, the mesh,
# the pipeline, XLA, fault tolerance, Megatron's settings) cost import time that a run which
# never uses them should not pay. `from accel_parallel import X` and `accel_parallel.X` work as
# before; the registry imports the built-in strategies on its first read (see _registry).
_LAZY = {
    "DDPCommunicationHookType": "accel_parallel._ddp",
    "DDPStrategy": "accel_parallel._ddp",
    "DistributedDataParallelKwargs": "accel_parallel._ddp",
    "register_comm_hook": "accel_parallel._ddp",
    "DeepSpeedStrategy": "accel_parallel._deepspeed",
    "DeepSpeedPlugin": "accel_parallel._deepspeed_plugin",
    "DummyOptim": "accel_parallel._deepspeed_plugin",
    "DummyScheduler": "accel_parallel._deepspeed_plugin",
    "HfDeepSpeedConfig": "accel_parallel._deepspeed_plugin",
    "FaultTolerantStrategy": "accel_parallel._fault_tolerant",
    "FSDP2Strategy": "accel_parallel._fsdp",
    "FullyShardedDataParallelPlugin": "accel_parallel._fsdp_plugin",
    "StagingBuffers": "accel_parallel._io",
    "add_job": "accel_parallel._io",
    "deferred_fsync": "accel_parallel._io",
    "deferred_write": "accel_parallel._io",
    "fsync_dir": "accel_parallel._io",
    "fsync_enabled": "accel_parallel._io",
    "fsync_file": "accel_parallel._io",
    "parallel_writes": "accel_parallel._io",
    "run_parallel": "accel_parallel._io",
    "save_object": "accel_parallel._io",
    "staged_writes": "accel_parallel._io",
    "staging": "accel_parallel._io",
    "MegatronLMPlugin": "accel_parallel._megatron",
    "megatron_settings": "accel_parallel._megatron",
    "MeshStrategy": "accel_parallel._mesh",
    "mesh_local_rank": "accel_parallel._mesh",
    "ParallelismConfig": "accel_parallel._parallelism_config",
    "TorchContextParallelConfig": "accel_parallel._parallelism_config",
    "TorchTensorParallelConfig": "accel_parallel._parallelism_config",
    "TorchTensorParallelPlugin": "accel_parallel._parallelism_config",
    "resolve_parallelism_config": "accel_parallel._parallelism_config",
    "PipelinedModel": "accel_parallel._pipeline",
    "PipelineOutput": "accel_parallel._pipeline",
    "PipelineStrategy": "accel_parallel._pipeline",
    "PP_SCHEDULES": "accel_parallel._pipeline_plan",
    "balanced_stage_map": "accel_parallel._pipeline_plan",
    "mend_pipeline_stage": "accel_parallel._pipeline_torch",
    "ResolvedEngine": "accel_parallel._registry",
    "StrategyRequest": "accel_parallel._registry",
    "build_strategy": "accel_parallel._registry",
    "process_placement": "accel_parallel._registry",
    "register_strategy": "accel_parallel._registry",
    "registered_strategies": "accel_parallel._registry",
    "resolve_strategy": "accel_parallel._registry",
    "SingleDeviceStrategy": "accel_parallel._single",
    "JoinsUnevenInputs": "accel_parallel._strategy",
    "ProcessInfo": "accel_parallel._strategy",
    "Strategy": "accel_parallel._strategy",
    "no_sync_all": "accel_parallel._strategy",
    "unwrap_parallel": "accel_parallel._strategy",
    "ReplicateParallel": "accel_parallel._tp",
    "apply_tensor_parallel": "accel_parallel._tp",
    "XLASpmdStrategy": "accel_parallel._xla",
    "XLAStrategy": "accel_parallel._xla",
    "XLATopology": "accel_parallel._xla",
    "xla_requested": "accel_state.xla_env",  # the rule's owner; re-exported for strategies
    "xla_topology": "accel_parallel._xla",
    "merge_fsdp_weights": "accel_parallel.checkpoint",
}

if TYPE_CHECKING:
    from accel_parallel._ddp import (
        DDPCommunicationHookType,
        DDPStrategy,
        DistributedDataParallelKwargs,
        register_comm_hook,
    )
    from accel_parallel._deepspeed import DeepSpeedStrategy
    from accel_parallel._deepspeed_plugin import (
        DeepSpeedPlugin,
        DummyOptim,
        DummyScheduler,
        HfDeepSpeedConfig,
    )
    from accel_parallel._fault_tolerant import FaultTolerantStrategy
    from accel_parallel._fsdp import FSDP2Strategy
    from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
    from accel_parallel._io import (
        StagingBuffers,
        add_job,
        deferred_fsync,
        deferred_write,
        fsync_dir,
        fsync_enabled,
        fsync_file,
        parallel_writes,
        run_parallel,
        save_object,
        staged_writes,
        staging,
    )
    from accel_parallel._megatron import MegatronLMPlugin, megatron_settings
    from accel_parallel._mesh import MeshStrategy, mesh_local_rank
    from accel_parallel._parallelism_config import (
        ParallelismConfig,
        TorchContextParallelConfig,
        TorchTensorParallelConfig,
        TorchTensorParallelPlugin,
        resolve_parallelism_config,
    )
    from accel_parallel._pipeline import PipelinedModel, PipelineOutput, PipelineStrategy
    from accel_parallel._pipeline_plan import PP_SCHEDULES, balanced_stage_map
    from accel_parallel._pipeline_torch import mend_pipeline_stage
    from accel_parallel._registry import (
        ResolvedEngine,
        StrategyRequest,
        build_strategy,
        process_placement,
        register_strategy,
        registered_strategies,
        resolve_strategy,
    )
    from accel_parallel._single import SingleDeviceStrategy
    from accel_parallel._strategy import (
        JoinsUnevenInputs,
        ProcessInfo,
        Strategy,
        no_sync_all,
        unwrap_parallel,
    )
    from accel_parallel._tp import ReplicateParallel, apply_tensor_parallel
    from accel_parallel._xla import (
        XLASpmdStrategy,
        XLAStrategy,
        XLATopology,
        xla_topology,
    )
    from accel_parallel.checkpoint import merge_fsdp_weights
    from accel_state.xla_env import xla_requested


# The public submodules, reachable as attributes as when the package imported them all.
_SUBMODULES = frozenset({"checkpoint", "familiar", "fault_tolerance", "memory"})


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"accel_parallel.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


__version__ = "0.1.0"

__all__ = [
    "PP_SCHEDULES",
    "DDPCommunicationHookType",
    "DDPStrategy",
    "DeepSpeedPlugin",
    "DeepSpeedStrategy",
    "DistributedDataParallelKwargs",
    "DummyOptim",
    "DummyScheduler",
    "FSDP2Strategy",
    "FaultTolerantStrategy",
    "FullyShardedDataParallelPlugin",
    "HfDeepSpeedConfig",
    "JoinsUnevenInputs",
    "MegatronLMPlugin",
    "MeshStrategy",
    "ParallelismConfig",
    "PipelineOutput",
    "PipelineStrategy",
    "PipelinedModel",
    "ProcessInfo",
    "ReplicateParallel",
    "ResolvedEngine",
    "SingleDeviceStrategy",
    "StagingBuffers",
    "Strategy",
    "StrategyRequest",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "XLASpmdStrategy",
    "XLAStrategy",
    "XLATopology",
    "add_job",
    "apply_tensor_parallel",
    "balanced_stage_map",
    "build_strategy",
    "deferred_fsync",
    "deferred_write",
    "fsync_dir",
    "fsync_enabled",
    "fsync_file",
    "megatron_settings",
    "mend_pipeline_stage",
    "merge_fsdp_weights",
    "mesh_local_rank",
    "no_sync_all",
    "parallel_writes",
    "process_placement",
    "register_comm_hook",
    "register_strategy",
    "registered_strategies",
    "resolve_parallelism_config",
    "resolve_strategy",
    "run_parallel",
    "save_object",
    "staged_writes",
    "staging",
    "unwrap_parallel",
    "xla_requested",
    "xla_topology",
]
