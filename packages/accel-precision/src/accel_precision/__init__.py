"""accel-precision: mixed precision as one object (autocast, loss scaling, fp8).

`make_precision(mode, ...)` returns a `Precision` whose methods are the same in every mode:
`autocast`, `convert_module`, `wrap_forward`/`unwrap_forward`, `backward`, `unscale_`, `step`,
`update`, `state_dict`/`load_state_dict`. The fp8 conversion helpers work on their own.

Importing this package does nothing: TransformerEngine and torchao are imported only when an
fp8 precision or a conversion helper needs them.
"""

from accel_precision._forward import (
    convert_outputs_to_fp32,
    has_wrapped_forward,
    unwrap_forward,
    wrap_forward,
)
from accel_precision._fp8 import MIN_FP8_CAPABILITY, check_fp8_support, resolve_fp8_backend
from accel_precision._fp8_ao import (
    ao_float8_filter,
    convert_model_to_fp8_ao,
    convert_to_ao_float8,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_float8_layers,
)
from accel_precision._fp8_te import (
    convert_to_te,
    has_te_layers,
    te_convertible,
    te_fp8_autocast,
    te_recipe,
)
from accel_precision._kwargs import (
    AO_MIN_FEATURES,
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
)
from accel_precision._modes import (
    PRECISION_MODES,
    FP8Precision,
    HalfPrecision,
    MixedPrecision,
    make_precision,
)
from accel_precision._optim import rebind_optimizer
from accel_precision._precision import Precision

__version__ = "0.1.0"

__all__ = [
    "AO_MIN_FEATURES",
    "MIN_FP8_CAPABILITY",
    "PRECISION_MODES",
    "AORecipeKwargs",
    "AutocastKwargs",
    "FP8Precision",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "TERecipeKwargs",
    "ao_float8_filter",
    "check_fp8_support",
    "convert_model_to_fp8_ao",
    "convert_outputs_to_fp32",
    "convert_to_ao_float8",
    "convert_to_te",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_float8_layers",
    "has_te_layers",
    "has_wrapped_forward",
    "make_precision",
    "rebind_optimizer",
    "resolve_fp8_backend",
    "te_convertible",
    "te_fp8_autocast",
    "te_recipe",
    "unwrap_forward",
    "wrap_forward",
]
