"""Familiar path `accelerate.utils.dataclasses`: re-exports from the packages that own the code."""

from accel._accelerator import (
    GradientAccumulationPlugin,
    ProfileKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from accel._compat._constants import (
    MITA_PROFILING_AVAILABLE_PYTORCH_VERSION,
    XPU_PROFILING_AVAILABLE_PYTORCH_VERSION,
)
from accel._compat._extras import ComputeEnvironment, CustomDtype, DynamoBackend, KwargsHandler
from accel._compat._left_out import (
    BnbQuantizationConfig,
    DeepSpeedSequenceParallelConfig,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    SageMakerDistributedType,
    add_model_config_to_megatron_parser,
)
from accel._compat._operations import TensorInformation
from accel_data import DataLoaderConfiguration
from accel_parallel import (
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from accel_precision import (
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
)
from accel_state import DistributedType, InitProcessGroupKwargs, LoggerType, PrecisionType, RNGType

__all__ = [
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "AORecipeKwargs",
    "AutocastKwargs",
    "BnbQuantizationConfig",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "add_model_config_to_megatron_parser",
]
