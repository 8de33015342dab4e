"""Familiar path `accelerate.utils.fsdp_utils`: re-exports from the packages that own the code."""

from accel._compat._constants import (
    FSDP_MODEL_NAME,
    OPTIMIZER_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
)
from accel._compat._left_out import (
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
)
from accel._compat._utils_dataclasses import (
    get_module_class_from_name,
)
from accel._compat._utils_fsdp_utils import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    fsdp2_canonicalize_names,
    fsdp2_prepare_auto_wrap_policy,
    get_fsdp2_grad_scaler,
    get_parameters_from_modules,
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from accel._compat._utils_modeling import (
    is_peft_model,
)
from accel._compat._utils_other import (
    get_module_children_bottom_up,
    is_compiled_module,
    save,
)
from accel._compat._versions import (
    is_torch_version,
)
from accel._logging import (
    get_logger,
)
from accel_bigmodel import get_non_persistent_buffers
from accel_parallel.checkpoint import merge_fsdp_weights

__all__ = [
    "FSDP_MODEL_NAME",
    "OPTIMIZER_NAME",
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_NAME",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_module_class_from_name",
    "get_non_persistent_buffers",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "get_logger",
    "get_module_children_bottom_up",
    "is_compiled_module",
    "is_peft_model",
    "is_torch_version",
    "save",
]
