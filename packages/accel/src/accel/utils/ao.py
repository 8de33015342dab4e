"""Familiar path `accelerate.utils.ao`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_torchao_available,
    torchao_required,
)
from accel_precision import (
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
)
from accel_precision import has_ao_float8_layers as has_ao_layers

__all__ = [
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "is_torchao_available",
    "torchao_required",
]
