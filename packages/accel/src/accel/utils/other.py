"""Familiar path `accelerate.utils.other`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    write_basic_config,
)
from accel._compat._constants import FSDP_PYTORCH_VERSION
from accel._compat._imports import (
    is_deepspeed_available,
    is_numpy_available,
    is_torch_distributed_available,
    is_weights_only_available,
)
from accel._compat._left_out import (
    convert_model,
)
from accel._compat._utils_other import (
    TORCH_SAFE_GLOBALS,
    check_os_kernel,
    clean_state_dict_for_safetensors,
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    convert_bytes,
    extract_model_from_parallel,
    get_free_port,
    get_model_tp_size,
    get_module_children_bottom_up,
    get_pretty_name,
    has_compiled_regions,
    is_compiled_module,
    is_port_in_use,
    load,
    merge_dicts,
    model_has_dtensor,
    recursive_getattr,
    save,
)
from accel._compat._versions import (
    is_torch_version,
)
from accel._dynamo import has_repeated_blocks, is_repeated_blocks
from accel._logging import (
    get_logger,
)
from accel_bigmodel import (
    id_tensor_storage,
)
from accel_state import (
    DistributedType,
    PartialState,
    wait_for_everyone,
)

__all__ = [
    "FSDP_PYTORCH_VERSION",
    "TORCH_SAFE_GLOBALS",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_free_port",
    "get_model_tp_size",
    "get_module_children_bottom_up",
    "get_pretty_name",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_numpy_available",
    "is_port_in_use",
    "is_repeated_blocks",
    "is_torch_distributed_available",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "DistributedType",
    "PartialState",
    "convert_model",
    "get_logger",
    "id_tensor_storage",
    "is_deepspeed_available",
    "is_torch_version",
    "is_weights_only_available",
    "write_basic_config",
]
