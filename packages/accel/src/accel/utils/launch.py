"""Familiar path `accelerate.utils.launch`: re-exports from the packages that own the code."""

import argparse
import subprocess
from shutil import which

from accel._compat._constants import DEEPSPEED_MULTINODE_LAUNCHERS
from accel._compat._environment import (
    str_to_bool,
)
from accel._compat._imports import (
    is_fp8_available,
)
from accel._compat._left_out import (
    PrepareForLaunch,
    prepare_deepspeed_cmd_env,
    prepare_sagemager_args_inputs,
)
from accel._compat._utils_dataclasses import (
    DynamoBackend,
    SageMakerDistributedType,
)
from accel._compat._utils_launch import (
    env_var_path_add,
    prepare_extend_env_parallelism_config,
    setup_fp8_env,
)
from accel._compat._utils_other import (
    get_free_port,
    is_port_in_use,
    merge_dicts,
)
from accel._compat._versions import (
    compare_versions,
)
from accel_cli.familiar import SageMakerConfig, prepare_multi_gpu_env, prepare_tpu
from accel_cli.familiar import convert_nargs_to_dict as _convert_nargs_to_dict
from accel_cli.familiar import (
    prepare_simple_launcher_cmd_env as _prepare_simple_launcher_cmd_env,
)
from accel_state import (
    DistributedType,
    PrecisionType,
)

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "PrepareForLaunch",
    "SageMakerConfig",
    "_convert_nargs_to_dict",
    "env_var_path_add",
    "get_free_port",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "setup_fp8_env",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "DistributedType",
    "DynamoBackend",
    "PrecisionType",
    "SageMakerDistributedType",
    "compare_versions",
    "is_fp8_available",
    "is_port_in_use",
    "merge_dicts",
    "str_to_bool",
]


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """accelerate's function. A hostfile run finds mpirun through this module's `which` and
    `subprocess.check_output`, looked up at call time: the names accelerate's tests patch."""
    return _prepare_simple_launcher_cmd_env(
        args,
        which=lambda name: which(name),
        mpi_version=lambda name: subprocess.check_output([name, "--version"]),
    )


__all__ += ["subprocess", "which"]
