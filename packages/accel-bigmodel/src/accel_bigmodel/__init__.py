"""accel-bigmodel: load and run models larger than memory.

Empty (meta-device) init, module sizes and device maps, forward hooks that move weights and
inputs, CPU and disk offload (memory-mapped, prefetched on CUDA), and streaming checkpoint
loading. Needs only torch, safetensors and psutil. Importing it does nothing else.
"""

from accel_bigmodel._auto_map import (
    get_balanced_memory,
    infer_auto_device_map,
    resolve_device_map,
)
from accel_bigmodel._checkpoint import LoadResult, checkpoint_files, load_checkpoint_in_model
from accel_bigmodel._device_map import (
    check_device_map,
    clean_device_map,
)
from accel_bigmodel._dispatch import (
    CpuOffload,
    UserCpuOffloadHook,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from accel_bigmodel._export import load_weights_file, save_sharded_weights, save_weights_file
from accel_bigmodel._header import read_safetensors_header
from accel_bigmodel._hook_utils import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    LayerwiseCastingHook,
    attach_execution_device_hook,
    attach_layerwise_casting_hooks,
    remove_hook_from_submodules,
)
from accel_bigmodel._hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    find_device,
    remove_hook_from_module,
    send_to_device,
)
from accel_bigmodel._modeling import (
    find_tied_parameters,
    get_non_persistent_buffers,
    init_empty_weights,
    init_on_device,
    retie_parameters,
    set_module_tensor_to_device,
)
from accel_bigmodel._offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    load_offload_index,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from accel_bigmodel._planning import (
    fallback_allocate,
    get_module_leaves,
    get_module_size_with_ties,
)
from accel_bigmodel._reader import CheckpointReader
from accel_bigmodel._sizes import (
    CustomDtype,
    calculate_maximum_sizes,
    check_device_same,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    get_max_layer_size,
    get_max_memory,
    named_module_tensors,
)
from accel_bigmodel._tensors import (
    align_module_device,
    check_tied_parameters_on_same_device,
    extract_submodules_state_dict,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    load_offloaded_weight,
    load_state_dict,
)

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "AlignDevicesHook",
    "CheckpointReader",
    "CpuOffload",
    "CustomDtype",
    "LayerwiseCastingHook",
    "LoadResult",
    "ModelHook",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "align_module_device",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "attach_layerwise_casting_hooks",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_on_same_device",
    "checkpoint_files",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "dtype_byte_size",
    "extract_submodules_state_dict",
    "fallback_allocate",
    "find_device",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "load_offload_index",
    "load_offloaded_weight",
    "load_state_dict",
    "load_weights_file",
    "named_module_tensors",
    "offload_state_dict",
    "offload_weight",
    "read_safetensors_header",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "resolve_device_map",
    "retie_parameters",
    "save_offload_index",
    "save_sharded_weights",
    "save_weights_file",
    "send_to_device",
    "set_module_tensor_to_device",
]
