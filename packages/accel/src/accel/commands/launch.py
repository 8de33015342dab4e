"""Familiar path `accelerate.commands.launch`: re-exports from the packages that own the code."""

from accel._compat._environment import (
    check_cuda_p2p_ib_support,
    convert_dict_to_env_variables,
    get_int_from_env,
    patch_environment,
    str_to_bool,
)
from accel._compat._extras import (
    ComputeEnvironment,
)
from accel._compat._imports import (
    is_bf16_available,
    is_deepspeed_available,
    is_rich_available,
    is_sagemaker_available,
)
from accel._compat._left_out import (
    PrepareForLaunch,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)
from accel._compat._misc import cli_command, cli_main, cli_parser
from accel_cli._config import (
    load_config_from_file,
)
from accel_state import (
    DistributedType,
)

launch_command = cli_command("launch_command")


launch_command_parser = cli_parser("launch")


main = cli_main("launch")


__all__ = ["launch_command", "launch_command_parser", "main"]


__all__ += [
    "ComputeEnvironment",
    "DistributedType",
    "PrepareForLaunch",
    "check_cuda_p2p_ib_support",
    "convert_dict_to_env_variables",
    "get_int_from_env",
    "is_bf16_available",
    "is_deepspeed_available",
    "is_rich_available",
    "is_sagemaker_available",
    "load_config_from_file",
    "patch_environment",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "str_to_bool",
]
