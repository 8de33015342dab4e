"""Operations over nested data (lists, tuples, dicts of tensors) beyond accel-state's."""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import torch

from accel_state import (
    DistributedOperationException,
    PartialState,
    broadcast,
    device_entry,
    find_batch_size,
    gather_object,
    recursively_apply,
    reduce,
)

# The switches for the collectives' shape checks: accelerate's name, and accel-state's own.
ENV_DEBUG_SWITCHES = ("ACCELERATE_DEBUG_MODE", "ACCEL_DEBUG_MODE")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on", "y", "t")


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


class ConvertOutputsToFp32:
    """A forward function whose fp16/bf16 tensor outputs come back as fp32. It refuses to be
    pickled: unwrap the model first (`extract_model_from_parallel(keep_fp32_wrapper=False)`)."""

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> NoReturn:
        raise pickle.PicklingError(
            "A forward wrapped to return fp32 outputs cannot be pickled; unwrap the model with "
            "Accelerator.unwrap_model(model) (or extract_model_from_parallel(model, "
            "keep_fp32_wrapper=False)) before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """`model_forward` wrapped so its fp16/bf16 tensor outputs are returned as fp32."""
    return ConvertOutputsToFp32(model_forward)


# The dtype codes `gather_tensor_shape` sends along with a shape (0 marks "no data").
TENSOR_TYPE_TO_INT: dict[torch.dtype, int] = {
    torch.float: 1,
    torch.double: 2,
    torch.half: 3,
    torch.bfloat16: 4,
    torch.uint8: 5,
    torch.int8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.bool: 10,
}
TENSOR_INT_TO_DTYPE: dict[int, torch.dtype] = {v: k for k, v in TENSOR_TYPE_TO_INT.items()}


def get_shape(data: Any) -> Any:
    """`data` with each tensor replaced by its shape as a list of ints."""
    return recursively_apply(lambda t: list(t.shape), data)


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """(the shape, the dtype code of `TENSOR_TYPE_TO_INT`) of a tensor that one process holds
    (the others pass None), known on every process afterwards. Dimensions of size 0 are not
    representable (the code is summed across processes and zeros dropped)."""
    state = PartialState()
    code = torch.zeros(64, dtype=torch.long, device=state.device)
    if tensor is not None:
        values = [*tensor.shape, TENSOR_TYPE_TO_INT[tensor.dtype]]
        code[: len(values)] = torch.tensor(values, dtype=torch.long)
    code = reduce(code, reduction="sum")
    code = code[code.nonzero()]
    return code[:-1], int(code[-1:][0])


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """True for a tensor on an Intel XPU device."""
    return isinstance(tensor, torch.Tensor) and device_entry(tensor.device) is device_entry("xpu")


def _debug_on() -> bool:
    state = PartialState()
    return bool(getattr(state, "debug", False)) or any(map(_env_flag, ENV_DEBUG_SWITCHES))


def verify_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a collective taking `tensor` first: in debug mode (ACCELERATE_DEBUG_MODE,
    ACCEL_DEBUG_MODE, or `PartialState().debug`), with more than one process, it checks that
    the tensors are on the state's device and have the same shapes on every process, raising
    DistributedOperationException naming each process's shapes instead of hanging."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = PartialState()
        if state.num_processes == 1 or not _debug_on():
            return function(*args, **kwargs)
        operation = f"{function.__module__}.{function.__name__}"
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        device = find_device(tensor)
        if device is not None and device.type != state.device.type:
            raise DistributedOperationException(
                f"{operation} got tensors on {device.type} while the processes run on "
                f"{state.device.type}; move them to {state.device.type} first."
            )
        shapes = gather_object([get_shape(tensor)])
        if any(s != shapes[0] for s in shapes):
            listing = "\n  - ".join(f"Process {i}: {s}" for i, s in enumerate(shapes))
            raise DistributedOperationException(
                f"Cannot apply {operation}: the tensors' shapes differ across processes and "
                f"must be the same.\nInput shapes:\n  - {listing}"
            )
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: a DistributedOperationException raised inside `function` is re-raised naming
    `function`, chained to the original (which names the shapes)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            operation = f"{function.__module__}.{function.__name__}"
            raise DistributedOperationException(
                f"Error while calling {operation}; see the error above for the details."
            ) from error

    return wrapper
