"""Familiar path `accelerate.launchers`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratorState,
)
from accel._compat._commands import test_launch
from accel._compat._constants import ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION
from accel._compat._environment import (
    are_libraries_initialized,
    check_cuda_p2p_ib_support,
    get_current_device_type,
    get_gpu_info,
    patch_environment,
)
from accel._compat._imports import (
    is_mps_available,
    is_rocm_available,
)
from accel._compat._left_out import (
    PrepareForLaunch,
)
from accel._compat._versions import (
    is_torch_version,
)
from accel._launchers import debug_launcher, notebook_launcher
from accel_state import (
    PartialState,
    PrecisionType,
)

__all__ = ["debug_launcher", "notebook_launcher", "test_launch"]

# accelerate's module binds these too; users import them from here
__all__ += [
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
    "AcceleratorState",
    "PartialState",
    "PrecisionType",
    "PrepareForLaunch",
    "are_libraries_initialized",
    "check_cuda_p2p_ib_support",
    "get_current_device_type",
    "get_gpu_info",
    "is_mps_available",
    "is_rocm_available",
    "is_torch_version",
    "patch_environment",
]
