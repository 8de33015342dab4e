"""accel-parallel: training strategies that wrap a model and its optimizer.

One small object per backend behind `Strategy` (single device, DDP, FSDP2);
`select_strategy` picks it once.
"""

from accel_parallel._ddp import (
    DDPCommunicationHookType,
    DDPStrategy,
    DistributedDataParallelKwargs,
    register_comm_hook,
)
from accel_parallel._fsdp import FSDP2Strategy
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._io import (
    add_job,
    deferred_fsync,
    deferred_write,
    fsync_dir,
    fsync_file,
    save_object,
    staged_writes,
    staging,
)
from accel_parallel._select import select_strategy
from accel_parallel._single import SingleDeviceStrategy
from accel_parallel._strategy import ProcessInfo, Strategy, no_sync_all

__version__ = "0.1.0"

__all__ = [
    "DDPCommunicationHookType",
    "DDPStrategy",
    "DistributedDataParallelKwargs",
    "FSDP2Strategy",
    "FullyShardedDataParallelPlugin",
    "ProcessInfo",
    "SingleDeviceStrategy",
    "Strategy",
    "add_job",
    "deferred_fsync",
    "deferred_write",
    "fsync_dir",
    "fsync_file",
    "no_sync_all",
    "register_comm_hook",
    "save_object",
    "select_strategy",
    "staged_writes",
    "staging",
]
