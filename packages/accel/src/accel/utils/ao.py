"""Familiar path `accelerate.utils.ao`: re-exports from the packages that own the code."""

from accel._compat._left_out import filter_first_and_last_linear_layers
from accel_precision import convert_to_ao_float8 as convert_model_to_fp8_ao
from accel_precision import has_ao_float8_layers as has_ao_layers

__all__ = ["convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "has_ao_layers"]
