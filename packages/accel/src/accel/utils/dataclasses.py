"""Familiar path `accelerate.utils.dataclasses`: re-exports from the packages that own the code."""

from accel._accelerator import (
    GradientAccumulationPlugin,
    ProfileKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from accel._compat._constants import (
    BETA_CP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
    FSDP2_PYTORCH_VERSION,
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
    MITA_PROFILING_AVAILABLE_PYTORCH_VERSION,
    XPU_PROFILING_AVAILABLE_PYTORCH_VERSION,
)
from accel._compat._environment import (
    parse_flag_from_env,
    str_to_bool,
)
from accel._compat._imports import (
    is_cuda_available,
    is_msamp_available,
    is_rocm_available,
    is_torchao_available,
    is_transformer_engine_available,
)
from accel._compat._left_out import (
    MODEL_CONFIGS_TO_MEGATRON_PARSERS,
    MSAMPRecipeKwargs,
    add_model_config_to_megatron_parser,
    parse_bert_config,
    parse_glm4_moe_config,
    parse_gpt2_config,
    parse_llama_config,
    parse_t5_config,
)
from accel._compat._operations import TensorInformation
from accel._compat._utils_dataclasses import (
    BaseEnum,
    CustomDtype,
    DynamoBackend,
    EnumWithContains,
    FP8BackendType,
    KwargsHandler,
    SageMakerDistributedType,
    get_module_class_from_name,
)
from accel._compat._versions import (
    compare_versions,
    is_torch_version,
)
from accel_bigmodel.quantization import BnbQuantizationConfig
from accel_cli.familiar import ComputeEnvironment
from accel_data import DataLoaderConfiguration
from accel_parallel import (
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)
from accel_parallel.familiar import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
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
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MODEL_CONFIGS_TO_MEGATRON_PARSERS",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "AORecipeKwargs",
    "AutocastKwargs",
    "BaseEnum",
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
    "EnumWithContains",
    "FP8BackendType",
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
    "get_module_class_from_name",
    "parse_bert_config",
    "parse_glm4_moe_config",
    "parse_gpt2_config",
    "parse_llama_config",
    "parse_t5_config",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGY",
    "compare_versions",
    "is_cuda_available",
    "is_msamp_available",
    "is_rocm_available",
    "is_torch_version",
    "is_torchao_available",
    "is_transformer_engine_available",
    "parse_flag_from_env",
    "str_to_bool",
]
