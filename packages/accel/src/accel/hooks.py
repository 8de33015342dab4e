"""Familiar path `accelerate.hooks`: re-exports from accel-bigmodel."""

from accel_bigmodel import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    remove_hook_from_module,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "remove_hook_from_module",
]
