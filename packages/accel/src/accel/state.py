"""Familiar path `accelerate.state`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratorState,
    GradientAccumulationPlugin,
    GradientState,
)
from accel._compat._environment import (
    check_cuda_p2p_ib_support,
    get_cpu_distributed_information,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
)
from accel._compat._imports import (
    deepspeed_required,
    is_datasets_available,
    is_deepspeed_available,
    is_fp8_available,
    is_habana_gaudi1,
    is_mps_available,
    is_xccl_available,
)
from accel._compat._state import (
    ThreadLocalSharedDict,
    do_nothing,
    is_initialized,
)
from accel._compat._utils_dataclasses import (
    DynamoBackend,
    SageMakerDistributedType,
)
from accel_state import DistributedType, PartialState

__all__ = [
    "AcceleratorState",
    "DistributedType",
    "GradientState",
    "PartialState",
    "ThreadLocalSharedDict",
    "do_nothing",
    "is_initialized",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "DynamoBackend",
    "GradientAccumulationPlugin",
    "SageMakerDistributedType",
    "check_cuda_p2p_ib_support",
    "deepspeed_required",
    "get_cpu_distributed_information",
    "get_int_from_env",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_fp8_available",
    "is_habana_gaudi1",
    "is_mps_available",
    "is_xccl_available",
    "parse_choice_from_env",
    "parse_flag_from_env",
]
