"""Familiar path `accelerate.utils.offload`: re-exports from the packages that own the code."""

from accel_bigmodel import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]
