"""Familiar path `accelerate.utils.fsdp_utils`: re-exports from the packages that own the code."""

from accel._compat._constants import OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from accel._compat._fsdp_files import (
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from accel._compat._left_out import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
)
from accel._export import merge_fsdp_weights

__all__ = [
    "OPTIMIZER_NAME",
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_NAME",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]
