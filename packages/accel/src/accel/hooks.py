"""Familiar path `accelerate.hooks`: re-exports from the packages that own the code."""

from accel_bigmodel import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
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
