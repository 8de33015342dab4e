"""Familiar path `accelerate.utils.launch`: re-exports from the packages that own the code."""

from accel._compat._environment import (
    str_to_bool,
)
from accel._compat._extras import (
    DynamoBackend,
)
from accel._compat._imports import (
    is_fp8_available,
)
from accel._compat._left_out import (
    PrepareForLaunch,
    SageMakerDistributedType,
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
)
from accel._compat._other import (
    is_port_in_use,
    merge_dicts,
)
from accel._compat._versions import (
    compare_versions,
)
from accel_state import (
    DistributedType,
    PrecisionType,
)

__all__ = [
    "PrepareForLaunch",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
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
