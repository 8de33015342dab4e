"""Familiar path `accelerate.checkpointing`: re-exports from the packages that own the code."""

from accel._compat._checkpointing import (
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
from accel._compat._constants import (
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from accel._compat._imports import (
    is_cuda_available,
)
from accel._compat._utils_other import (
    get_pretty_name,
    load,
    save,
)
from accel._compat._versions import (
    is_torch_version,
)
from accel._logging import (
    get_logger,
)
from accel_state import (
    PartialState,
)

__all__ = [
    "load_accelerator_state",
    "load_custom_state",
    "save_accelerator_state",
    "save_custom_state",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_NAME",
    "PartialState",
    "get_logger",
    "get_pretty_name",
    "is_cuda_available",
    "is_torch_version",
    "load",
    "save",
]
