"""Familiar path `accelerate.utils.operations`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratorState,
)
from accel._compat._constants import TORCH_DISTRIBUTED_OPERATION_TYPES
from accel._compat._imports import is_torch_distributed_available
from accel._compat._operations import (
    TENSOR_INT_TO_DTYPE,
    TENSOR_TYPE_TO_INT,
    ConvertOutputsToFp32,
    TensorInformation,
    chained_operation,
    convert_outputs_to_fp32,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_device,
    gather_tensor_shape,
    get_data_structure,
    get_shape,
    ignorant_find_batch_size,
    initialize_tensors,
    is_tensor_information,
    is_torch_xpu_tensor,
    listify,
    pad_input_tensors,
    slice_tensors,
    verify_operation,
)
from accel._compat._versions import (
    is_torch_version,
)
from accel_parallel.familiar import GatheredParameters
from accel_state import (
    CannotPadNestedTensorWarning,
    DistributedOperationException,
    DistributedType,
    PartialState,
    broadcast,
    broadcast_object_list,
    concatenate,
    find_batch_size,
    gather,
    gather_object,
    honor_type,
    is_namedtuple,
    is_torch_tensor,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
)

__all__ = [
    "TENSOR_INT_TO_DTYPE",
    "TENSOR_TYPE_TO_INT",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "GatheredParameters",
    "broadcast",
    "broadcast_object_list",
    "chained_operation",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "gather_tensor_shape",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_distributed_available",
    "is_torch_tensor",
    "is_torch_xpu_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "verify_operation",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratorState",
    "DistributedType",
    "PartialState",
    "TensorInformation",
    "is_torch_version",
]
