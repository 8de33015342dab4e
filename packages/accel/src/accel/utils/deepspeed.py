"""Familiar path `accelerate.utils.deepspeed`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
)
from accel._compat._imports import (
    is_bnb_available,
)
from accel._compat._versions import (
    compare_versions,
)
from accel._deepspeed import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    get_active_deepspeed_plugin,
)
from accel_parallel import DummyOptim, DummyScheduler, HfDeepSpeedConfig
from accel_parallel.familiar import map_pytorch_optim_to_deepspeed
from accel_state import (
    DistributedType,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "DistributedType",
    "compare_versions",
    "is_bnb_available",
]
