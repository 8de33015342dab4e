"""Familiar path `accelerate.accelerator`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    Accelerator,
    AcceleratorState,
    GradientAccumulationPlugin,
    GradientState,
    ProfileKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from accel._compat._checkpointing import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
from accel._compat._constants import (
    DTENSOR_PYTORCH_VERSION,
    FSDP2_PYTORCH_VERSION,
    FSDP_PYTORCH_VERSION,
    MODEL_NAME,
    PROFILE_PATTERN_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SCALER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)
from accel._compat._environment import (
    parse_choice_from_env,
)
from accel._compat._imports import (
    is_bf16_available,
    is_bitsandbytes_multi_backend_available,
    is_deepspeed_available,
    is_lomo_available,
    is_megatron_lm_available,
    is_msamp_available,
    is_torchao_available,
    is_transformer_engine_available,
    is_xpu_available,
)
from accel._compat._left_out import (
    MSAMPRecipeKwargs,
    apply_fp8_autowrap,
    convert_model,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
)
from accel._compat._operations import convert_outputs_to_fp32
from accel._compat._utils_dataclasses import (
    DynamoBackend,
    FP8BackendType,
    KwargsHandler,
)
from accel._compat._utils_fsdp_utils import (
    fsdp2_canonicalize_names,
    get_fsdp2_grad_scaler,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from accel._compat._utils_modeling import (
    get_grad_scaler,
    get_mixed_precision_context_manager,
)
from accel._compat._utils_other import (
    check_os_kernel,
    clean_state_dict_for_safetensors,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    extract_model_from_parallel,
    get_model_tp_size,
    get_pretty_name,
    is_compiled_module,
    model_has_dtensor,
    save,
)
from accel._compat._versions import (
    compare_versions,
    is_torch_version,
)
from accel._data_loader import (
    prepare_data_loader,
)
from accel._deepspeed import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)
from accel._logging import (
    get_logger,
)
from accel._memory import (
    release_memory,
)
from accel.utils import (
    convert_model_to_fp8_ao,
)
from accel_bigmodel import (
    get_state_dict_offloaded_model,
    has_offloaded_params,
)
from accel_data import (
    DataLoaderConfiguration,
    DataLoaderDispatcher,
    skip_first_batches,
)
from accel_parallel import (
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DummyOptim,
    DummyScheduler,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchTensorParallelPlugin,
)
from accel_parallel.familiar import (
    ParallelismConfig,
    map_pytorch_optim_to_deepspeed,
)
from accel_precision import (
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
)
from accel_state import (
    DistributedType,
    InitProcessGroupKwargs,
    LoggerType,
    PartialState,
    PrecisionType,
    RNGType,
    gather,
    gather_object,
    pad_across_processes,
    recursively_apply,
    reduce,
    wait_for_everyone,
)
from accel_tracking import TRACKER_CLASSES as LOGGER_TYPE_TO_CLASS
from accel_tracking import (
    GeneralTracker,
    filter_trackers,
)

__all__ = ["Accelerator"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "DTENSOR_PYTORCH_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "FSDP_PYTORCH_VERSION",
    "LOGGER_TYPE_TO_CLASS",
    "MODEL_NAME",
    "PROFILE_PATTERN_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SCALER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "AORecipeKwargs",
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "AcceleratorState",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "DynamoBackend",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GeneralTracker",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MSAMPRecipeKwargs",
    "MegatronLMPlugin",
    "ParallelismConfig",
    "PartialState",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TorchDynamoPlugin",
    "TorchTensorParallelPlugin",
    "apply_fp8_autowrap",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compare_versions",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_model",
    "convert_model_to_fp8_ao",
    "convert_outputs_to_fp32",
    "ensure_weights_retied",
    "extract_model_from_parallel",
    "filter_trackers",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "gather",
    "gather_object",
    "get_fsdp2_grad_scaler",
    "get_grad_scaler",
    "get_logger",
    "get_mixed_precision_context_manager",
    "get_model_tp_size",
    "get_pretty_name",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "is_bf16_available",
    "is_bitsandbytes_multi_backend_available",
    "is_compiled_module",
    "is_deepspeed_available",
    "is_lomo_available",
    "is_megatron_lm_available",
    "is_msamp_available",
    "is_torch_version",
    "is_torchao_available",
    "is_transformer_engine_available",
    "is_xpu_available",
    "load_accelerator_state",
    "load_custom_state",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "map_pytorch_optim_to_deepspeed",
    "model_has_dtensor",
    "pad_across_processes",
    "parse_choice_from_env",
    "prepare_data_loader",
    "recursively_apply",
    "reduce",
    "release_memory",
    "save",
    "save_accelerator_state",
    "save_custom_state",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "skip_first_batches",
    "wait_for_everyone",
]
