"""Familiar path `accelerate.big_modeling`: re-exports from the packages that own the code."""

from accel_bigmodel import (
    attach_layerwise_casting_hooks,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
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
