"""Familiar path `accelerate.commands.launch`: re-exports from the packages that own the code."""

from accel._compat._commands import cli_main
from accel._compat._environment import (
    check_cuda_p2p_ib_support,
    convert_dict_to_env_variables,
    get_int_from_env,
    patch_environment,
    str_to_bool,
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
    prepare_sagemager_args_inputs,
    sagemaker_launcher,
    tpu_pod_launcher,
)
from accel_cli.familiar import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    TORCH_DYNAMO_MODES,
    ComputeEnvironment,
    CustomArgumentParser,
    CustomHelpFormatter,
    SageMakerConfig,
    clean_option,
    launch_command,
    launch_command_parser,
    load_config_from_file,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
    tpu_launcher,
)
from accel_cli.familiar import validate_launch_command as _validate_launch_command
from accel_state import (
    DistributedType,
)

# Each of accelerate's launchers runs the launch `args` describe; accel picks the engine
# from `args` itself (one process, torchrun, DeepSpeed's runner or mpirun).
simple_launcher = multi_gpu_launcher = deepspeed_launcher = launch_command

main = cli_main("launch")


__all__ = ["_validate_launch_command", "launch_command", "launch_command_parser", "main"]


__all__ += [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "TORCH_DYNAMO_MODES",
    "ComputeEnvironment",
    "CustomArgumentParser",
    "CustomHelpFormatter",
    "DistributedType",
    "PrepareForLaunch",
    "SageMakerConfig",
    "check_cuda_p2p_ib_support",
    "clean_option",
    "convert_dict_to_env_variables",
    "deepspeed_launcher",
    "get_int_from_env",
    "is_bf16_available",
    "is_deepspeed_available",
    "is_rich_available",
    "is_sagemaker_available",
    "load_config_from_file",
    "multi_gpu_launcher",
    "patch_environment",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "sagemaker_launcher",
    "simple_launcher",
    "str_to_bool",
    "tpu_launcher",
    "tpu_pod_launcher",
]
