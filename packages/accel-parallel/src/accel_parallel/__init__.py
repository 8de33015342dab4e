"""accel-parallel: training strategies that wrap a model and its optimizer.

One small object per backend behind `Strategy` (single device, DDP, FSDP2, DeepSpeed ZeRO,
the pipeline / tensor-parallel / FSDP2 mesh of a `ParallelismConfig`, and XLA devices
through torch-xla), each registered by
name (`register_strategy`); `resolve_strategy` picks one once, from every source of
configuration.
"""

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
from accel_parallel._registry import (
    ResolvedEngine,
    StrategyRequest,
    build_strategy,
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
    xla_requested,
    xla_topology,
)
from accel_parallel.checkpoint import merge_fsdp_weights

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
    "merge_fsdp_weights",
    "mesh_local_rank",
    "no_sync_all",
    "parallel_writes",
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
