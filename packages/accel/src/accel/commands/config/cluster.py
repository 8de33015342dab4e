"""Familiar path `accelerate.commands.config.cluster`: re-exports from the packages that own the code."""

from accel._compat._constants import (
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
    FSDP_STATE_DICT_TYPE,
)
from accel._compat._imports import (
    is_deepspeed_available,
    is_fp8_available,
    is_mps_available,
    is_msamp_available,
    is_torchao_available,
    is_transformer_engine_available,
    is_transformers_available,
)
from accel_cli.familiar import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    FSDP2_STATE_DICT_TYPE,
    TORCH_DYNAMO_MODES,
    ClusterConfig,
    ComputeEnvironment,
    get_cluster_input,
)
from accel_state import (
    DistributedType,
)

__all__ = []

# accelerate's module binds these too; users import them from here
__all__ += [
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "ComputeEnvironment",
    "DistributedType",
    "is_deepspeed_available",
    "is_fp8_available",
    "is_mps_available",
    "is_msamp_available",
    "is_torchao_available",
    "is_transformer_engine_available",
    "is_transformers_available",
]

__all__ += [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "FSDP2_STATE_DICT_TYPE",
    "TORCH_DYNAMO_MODES",
    "ClusterConfig",
    "get_cluster_input",
]
