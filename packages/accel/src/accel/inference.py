"""Familiar path `accelerate.inference`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_pippy_available,
)
from accel._compat._operations import (
    copy_tensor_to_devices,
    ignorant_find_batch_size,
    pad_input_tensors,
)
from accel._compat._utils_other import (
    convert_bytes,
)
from accel._pippy import (
    build_pipeline,
    find_pippy_batch_size,
    generate_device_map,
    pippy_forward,
    prepare_pippy,
)
from accel_bigmodel import (
    calculate_maximum_sizes,
    infer_auto_device_map,
)
from accel_state import (
    PartialState,
    send_to_device,
)

__all__ = [
    "build_pipeline",
    "find_pippy_batch_size",
    "generate_device_map",
    "pippy_forward",
    "prepare_pippy",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "PartialState",
    "calculate_maximum_sizes",
    "convert_bytes",
    "copy_tensor_to_devices",
    "ignorant_find_batch_size",
    "infer_auto_device_map",
    "is_pippy_available",
    "pad_input_tensors",
    "send_to_device",
]
