"""Familiar path `accelerate.inference`: re-exports from the packages that own the code."""

from accel._pippy import (
    build_pipeline,
    find_pippy_batch_size,
    generate_device_map,
    pippy_forward,
    prepare_pippy,
)

__all__ = [
    "build_pipeline",
    "find_pippy_batch_size",
    "generate_device_map",
    "pippy_forward",
    "prepare_pippy",
]
