"""Familiar path `accelerate.big_modeling`: re-exports from the packages that own the code."""

from accel._compat._environment import (
    check_cuda_p2p_ib_support,
    parse_flag_from_env,
)
from accel._compat._imports import (
    is_bnb_available,
)
from accel._compat._utils_other import (
    recursive_getattr,
)
from accel_bigmodel import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    OffloadedWeightsLoader,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_layerwise_casting_hooks,
    check_device_map,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    extract_submodules_state_dict,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    offload_state_dict,
    retie_parameters,
)
from accel_parallel.familiar import (  # noqa: F401  (private; accelerate's tests import it)
    refuse_recurrent_layers as _refuse_recurrent_layers_under_sequence_parallelism,
)

__all__ = [
    "attach_layerwise_casting_hooks",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "OffloadedWeightsLoader",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "check_cuda_p2p_ib_support",
    "check_device_map",
    "extract_submodules_state_dict",
    "find_tied_parameters",
    "get_balanced_memory",
    "infer_auto_device_map",
    "is_bnb_available",
    "load_checkpoint_in_model",
    "offload_state_dict",
    "parse_flag_from_env",
    "recursive_getattr",
    "retie_parameters",
]
