"""Familiar path `accelerate.commands.config.sagemaker`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_boto3_available,
)
from accel._compat._utils_dataclasses import SageMakerDistributedType
from accel_cli.familiar import (
    DYNAMO_BACKENDS,
    SAGEMAKER_PARALLEL_EC2_INSTANCES,
    TORCH_DYNAMO_MODES,
    ComputeEnvironment,
    SageMakerConfig,
    get_sagemaker_input,
)

__all__ = []

# accelerate's module binds these too; users import them from here
__all__ += [
    "ComputeEnvironment",
    "SageMakerDistributedType",
    "is_boto3_available",
]

__all__ += [
    "DYNAMO_BACKENDS",
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "TORCH_DYNAMO_MODES",
    "SageMakerConfig",
    "get_sagemaker_input",
]
