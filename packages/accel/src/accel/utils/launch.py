"""Familiar path `accelerate.utils.launch`: re-exports from the packages that own the code."""

from accel._compat._left_out import (
    PrepareForLaunch,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)

__all__ = [
    "PrepareForLaunch",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
]
