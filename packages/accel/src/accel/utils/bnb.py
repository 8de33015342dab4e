"""Familiar path `accelerate.utils.bnb`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_4bit_bnb_available,
    is_8bit_bnb_available,
)
from accel_bigmodel import (
    dispatch_model,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_in_model,
    offload_weight,
    quantization,
    set_module_tensor_to_device,
)
from accel_bigmodel.quantization import *  # noqa: F403  (the names it declares)

__all__ = [*quantization.__all__]

# accelerate's module binds these too; users import them from here
__all__ += [
    "dispatch_model",
    "find_tied_parameters",
    "get_balanced_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "is_4bit_bnb_available",
    "is_8bit_bnb_available",
    "load_checkpoint_in_model",
    "offload_weight",
    "set_module_tensor_to_device",
]
