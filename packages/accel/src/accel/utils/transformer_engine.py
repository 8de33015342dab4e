"""Familiar path `accelerate.utils.transformer_engine`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_transformer_engine_available,
)
from accel._compat._left_out import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
)
from accel_parallel.familiar import GatheredParameters
from accel_precision import has_te_layers as has_transformer_engine_layers

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "GatheredParameters",
    "is_transformer_engine_available",
]
