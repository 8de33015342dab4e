"""accelerate's command-line names, as accel-cli provides them: what the umbrella's familiar
paths (`accel.commands.*`, `accel.utils.launch`, `accel.utils.dataclasses`, ...) re-export.

Only re-exports: the work lives in the private modules beside this one. accelerate's two
private helpers it names are spelled publicly here (`validate_launch_command` for its
`_validate_launch_command`, `convert_nargs_to_dict` for `_convert_nargs_to_dict`). The
commands of `accel` are here under the names the umbrella runs them by
(`config_default_command`, `estimate_memory_command`, ...), each taking parsed arguments and
returning the exit code.
"""

from accel_cli._argparse import (
    CustomArgumentGroup,
    CustomArgumentParser,
    CustomHelpFormatter,
    SubcommandHelpFormatter,
    clean_option,
)
from accel_cli._commands import build_parser
from accel_cli._commands.config import default as config_default_command
from accel_cli._commands.config import questionnaire as config_questionnaire_command
from accel_cli._commands.config import update as config_update_command
from accel_cli._commands.estimate_memory import run as estimate_memory_command
from accel_cli._commands.merge_weights import run as merge_weights_command
from accel_cli._commands.test import run as test_command
from accel_cli._commands.to_fsdp2 import run as to_fsdp2_command
from accel_cli._commands.tpu_config import tpu_command_launcher, tpu_command_parser
from accel_cli._config_args import (
    BaseConfig,
    ClusterConfig,
    ComputeEnvironment,
    SageMakerConfig,
    load_config_from_file,
)
from accel_cli._config_compat import (
    BulletMenu,
    get_cluster_input,
    get_config_parser,
    get_sagemaker_input,
    get_user_input,
    update_config,
)
from accel_cli._constants import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    FSDP2_STATE_DICT_TYPE,
    SAGEMAKER_PARALLEL_EC2_INSTANCES,
    SAGEMAKER_PYTHON_VERSION,
    SAGEMAKER_PYTORCH_VERSION,
    SAGEMAKER_TRANSFORMERS_VERSION,
    TORCH_DYNAMO_MODES,
)
from accel_cli._env_report import env_info
from accel_cli._estimate_compat import (
    add_timm_hub_prefix,
    check_has_model,
    create_ascii_table,
    create_empty_model,
    estimate_training_usage,
    gather_data,
    verify_on_hub,
)
from accel_cli._launch_compat import (
    convert_nargs_to_dict,
    launch_command,
    launch_command_parser,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
    tpu_launcher,
    validate_launch_command,
)
from accel_cli._migrate import (
    ARGUMENT_KEY_MAPPING,
    ARGUMENT_VALUE_MAPPING,
    ConversionStatus,
    convert_config_to_fsdp2,
    load_config,
)
from accel_cli._selftest import execute_subprocess_async, path_in_accelerate_package

__all__ = [
    "ARGUMENT_KEY_MAPPING",
    "ARGUMENT_VALUE_MAPPING",
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "FSDP2_STATE_DICT_TYPE",
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "TORCH_DYNAMO_MODES",
    "BaseConfig",
    "BulletMenu",
    "ClusterConfig",
    "ComputeEnvironment",
    "ConversionStatus",
    "CustomArgumentGroup",
    "CustomArgumentParser",
    "CustomHelpFormatter",
    "SageMakerConfig",
    "SubcommandHelpFormatter",
    "add_timm_hub_prefix",
    "build_parser",
    "check_has_model",
    "clean_option",
    "config_default_command",
    "config_questionnaire_command",
    "config_update_command",
    "convert_config_to_fsdp2",
    "convert_nargs_to_dict",
    "create_ascii_table",
    "create_empty_model",
    "env_info",
    "estimate_memory_command",
    "estimate_training_usage",
    "execute_subprocess_async",
    "gather_data",
    "get_cluster_input",
    "get_config_parser",
    "get_sagemaker_input",
    "get_user_input",
    "launch_command",
    "launch_command_parser",
    "load_config",
    "load_config_from_file",
    "merge_weights_command",
    "path_in_accelerate_package",
    "prepare_multi_gpu_env",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "test_command",
    "to_fsdp2_command",
    "tpu_command_launcher",
    "tpu_command_parser",
    "tpu_launcher",
    "update_config",
    "validate_launch_command",
    "verify_on_hub",
]
