"""Familiar path `accelerate.parallelism_config`: re-exports from the packages that own the code."""

from accel._compat._versions import (
    is_torch_version,
)
from accel_parallel import (
    TorchTensorParallelConfig,
)
from accel_parallel.familiar import (
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
)
from accel_state import (
    DistributedType,
)

__all__ = ["ParallelismConfig"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "DeepSpeedSequenceParallelConfig",
    "DistributedType",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "is_torch_version",
]
