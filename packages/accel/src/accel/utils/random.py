"""Familiar path `accelerate.utils.random`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratorState,
)
from accel._compat._constants import CUDA_DISTRIBUTED_TYPES
from accel_state import (
    DistributedType,
    RNGType,
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)

__all__ = [
    "CUDA_DISTRIBUTED_TYPES",
    "set_seed",
    "synchronize_rng_state",
    "synchronize_rng_states",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratorState",
    "DistributedType",
    "RNGType",
]
