"""Familiar path `accelerate.utils.modeling`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratorState,
)
from accel._compat._constants import SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from accel._compat._imports import (
    is_mps_available,
    is_peft_available,
    is_tqdm_available,
)
from accel._compat._utils_dataclasses import (
    CustomDtype,
)
from accel._compat._utils_modeling import (
    check_tied_parameters_in_config,
    get_grad_scaler,
    get_mixed_precision_context_manager,
    is_peft_model,
    load_offloaded_weights,
)
from accel._compat._utils_tqdm import (
    tqdm,
)
from accel._compat._versions import (
    is_torch_version,
)
from accel._memory import (
    clear_device_cache,
)
from accel_bigmodel import (
    align_module_device,
    calculate_maximum_sizes,
    check_device_map,
    check_device_same,
    check_tied_parameters_on_same_device,
    clean_device_map,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    fallback_allocate,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    infer_auto_device_map,
    load_checkpoint_in_model,
    load_offloaded_weight,
    load_state_dict,
    named_module_tensors,
    offload_weight,
    retie_parameters,
    save_offload_index,
    set_module_tensor_to_device,
)
from accel_precision import (
    AutocastKwargs,
)
from accel_state import (
    DistributedType,
)

__all__ = [
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratorState",
    "AutocastKwargs",
    "CustomDtype",
    "DistributedType",
    "clear_device_cache",
    "is_mps_available",
    "is_peft_available",
    "is_torch_version",
    "is_tqdm_available",
    "load_offloaded_weight",
    "offload_weight",
    "save_offload_index",
    "tqdm",
]
