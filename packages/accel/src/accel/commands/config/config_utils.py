"""Familiar path `accelerate.commands.config.config_utils`: re-exports from the packages that own the code."""

from accel._compat._utils_dataclasses import (
    DynamoBackend,
    FP8BackendType,
    SageMakerDistributedType,
)
from accel_cli.familiar import (
    DYNAMO_BACKENDS,
    BulletMenu,
    ComputeEnvironment,
    SubcommandHelpFormatter,
)
from accel_state import (
    DistributedType,
    PrecisionType,
)

__all__ = []

# accelerate's module binds these too; users import them from here
__all__ += [
    "ComputeEnvironment",
    "DistributedType",
    "DynamoBackend",
    "PrecisionType",
    "SageMakerDistributedType",
]

__all__ += [
    "DYNAMO_BACKENDS",
    "BulletMenu",
    "FP8BackendType",
    "SubcommandHelpFormatter",
]
