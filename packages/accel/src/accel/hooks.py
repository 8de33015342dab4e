"""Familiar path `accelerate.hooks`: re-exports from the packages that own the code."""

from accel._compat._operations import (
    find_device,
)
from accel._compat._utils_other import (
    recursive_getattr,
)
from accel._memory import (
    clear_device_cache,
)
from accel_bigmodel import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    ModelHook,
    PrefixedDataset,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    get_non_persistent_buffers,
    named_module_tensors,
    remove_hook_from_module,
    remove_hook_from_submodules,
    set_module_tensor_to_device,
)
from accel_state import (
    PartialState,
    send_to_device,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "PartialState",
    "PrefixedDataset",
    "clear_device_cache",
    "find_device",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "recursive_getattr",
    "send_to_device",
    "set_module_tensor_to_device",
]
