"""Familiar path `accelerate.utils.random`: re-exports from the packages that own the code."""

from accel_state import set_seed, synchronize_rng_state, synchronize_rng_states

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]
