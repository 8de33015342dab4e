"""Familiar path `accelerate.commands.config.sagemaker`: re-exports from the packages that own the code."""

from accel._compat._extras import (
    ComputeEnvironment,
)
from accel._compat._imports import (
    is_boto3_available,
)
from accel._compat._left_out import (
    SageMakerDistributedType,
)

__all__ = []

# accelerate's module binds these too; users import them from here
__all__ += [
    "ComputeEnvironment",
    "SageMakerDistributedType",
    "is_boto3_available",
]
