"""Operations over nested data (lists, tuples, dicts of tensors) beyond accel-state's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from accel_state import PartialState, broadcast, find_batch_size, recursively_apply


class CannotPadNestedTensorWarning(UserWarning):
    """Nested tensors cannot be padded across processes."""


@dataclasses.dataclass
class TensorInformation:
    shape: torch.Size
    dtype: torch.dtype


def is_tensor_information(obj: Any) -> bool:
    return isinstance(obj, TensorInformation)


def get_data_structure(data: Any) -> Any:
    """`data` with each tensor replaced by its shape and dtype."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Empty tensors for the shapes and dtypes `get_data_structure` recorded."""
    return recursively_apply(
        lambda info: torch.empty(info.shape, dtype=info.dtype),
        data_structure,
        test_type=is_tensor_information,
    )


def listify(data: Any) -> Any:
    """`data` with each tensor turned into (nested) Python lists or numbers."""

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.tolist()

    return recursively_apply(to_list, data)


def convert_to_fp32(tensor: Any) -> Any:
    """Every fp16/bf16 tensor in `tensor` converted to fp32."""
    return recursively_apply(
        lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, tensor
    )


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in `data`."""
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        for item in data:
            device = find_device(item)
            if device is not None:
                return device
        return None
    return data.device if isinstance(data, torch.Tensor) else None


def ignorant_find_batch_size(data: Any) -> int | None:
    """`find_batch_size`, or None where it cannot tell."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def slice_tensors(data: Any, tensor_slice: slice | int, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:  # fmt: skip
    """Every tensor in `data` indexed with `tensor_slice`."""
    return recursively_apply(lambda t: t[tensor_slice], data)


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad (repeating the last rows along `dim`) so `batch_size` divides by `num_processes`."""
    remainder = batch_size % num_processes
    if remainder == 0:
        return tensor
    extra = num_processes - remainder

    def pad(t: torch.Tensor) -> torch.Tensor:
        if t.dim() <= dim or t.shape[dim] != batch_size:
            return t
        last = t.narrow(dim, t.shape[dim] - 1, 1)
        return torch.cat(
            [t, last.expand(*[extra if i == dim else s for i, s in enumerate(t.shape)])], dim
        )

    return recursively_apply(pad, tensor)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The main process's `tensor` on every process (others pass None or any tensor of the
    same shape and dtype)."""
    state = PartialState()
    if state.num_processes == 1:
        return tensor
    if tensor is None:
        raise ValueError(
            "copy_tensor_to_devices needs a tensor of the right shape on every process."
        )
    return broadcast(tensor.to(state.device), from_process=0)
