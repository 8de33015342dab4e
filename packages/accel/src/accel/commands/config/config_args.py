"""Familiar path `accelerate.commands.config.config_args`: re-exports from the packages that own the code."""

from accel._compat._utils_dataclasses import SageMakerDistributedType
from accel_cli import default_config_path
from accel_cli.familiar import (
    SAGEMAKER_PYTHON_VERSION,
    SAGEMAKER_PYTORCH_VERSION,
    SAGEMAKER_TRANSFORMERS_VERSION,
    BaseConfig,
    ClusterConfig,
    ComputeEnvironment,
    SageMakerConfig,
    load_config_from_file,
)
from accel_state import (
    DistributedType,
)

default_config_file = str(default_config_path())  # where `accel config` writes, as of import


default_yaml_config_file = default_config_file


__all__ = ["default_config_file", "default_yaml_config_file", "load_config_from_file"]


__all__ += [
    "ComputeEnvironment",
    "DistributedType",
    "SageMakerDistributedType",
]

__all__ += [
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
]
