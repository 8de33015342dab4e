"""Familiar path `accelerate.utils.deepspeed`: re-exports from the packages that own the code."""

from accel._deepspeed import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    get_active_deepspeed_plugin,
)
from accel_parallel import DummyOptim, DummyScheduler, HfDeepSpeedConfig
from accel_parallel._deepspeed_parts import map_pytorch_optim_to_deepspeed

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
