"""The Accelerator's collectives, as a mixin: gather (for metrics: without the duplicates that
padded the final batch), reduce and pad over the data-parallel replicas, and the trigger
flag every process sees."""

from __future__ import annotations

import warnings
from typing import Any

import torch

import accel_state


class CollectivesMixin:
    """gather / gather_for_metrics / reduce / pad_across_processes / set_trigger / check_trigger."""

    def gather(self, tensor: Any) -> Any:
        return accel_state.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather across processes and drop the duplicates that padded the final batch."""
        all_tensors = _only_tensors(input_data)
        group = self._data_parallel_group()  # each data-parallel replica's samples once
        if group is False:
            data = input_data
            if use_gather_object or not all_tensors:
                data = list(data) if isinstance(data, (list, tuple)) else [data]
        elif use_gather_object or not all_tensors:
            data = accel_state.gather_object(input_data, group=group)
        else:
            data = accel_state.gather(input_data, group=group)
        if not self.gradient_state.end_of_dataloader:
            return data
        remainder = self.gradient_state.remainder
        if remainder < 0:
            warnings.warn(
                "gather_for_metrics: the dataloader's length is unknown, so the padded samples "
                "of the last batch cannot be dropped; drop them yourself.",
                stacklevel=2,
            )
            return data
        if remainder == 0:
            return data
        if isinstance(data, list):
            return data[:remainder]
        return accel_state.recursively_apply(lambda t: t[:remainder], data)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum or average over the data-parallel replicas (every process without a mesh)."""
        group = self._data_parallel_group()
        if group is False:
            return accel_state.reduce(tensor, "none", scale)
        return accel_state.reduce(tensor, reduction, scale, group=group)

    def _data_parallel_group(self) -> Any:
        """The group whose processes hold different samples: None for every process, False
        when this process is its only member (tensor/context parallel alone)."""
        if self.strategy.data_parallel_size == 1 and self.num_processes > 1:
            return False
        return self.strategy.data_parallel_group()

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        return accel_state.pad_across_processes(tensor, dim, pad_index, pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this process; `check_trigger` sees it on every process."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every process if any process called `set_trigger` (then the flag resets)."""
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self._collective_device())
        if accel_state.reduce(flag, "sum").item() > 0:
            self._trigger = False
            return True
        return False

    def _collective_device(self) -> torch.device:
        return torch.device("cpu") if self.state.backend in (None, "gloo") else self.device


def _only_tensors(data: Any) -> bool:
    found = {"other": False}

    def visit(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            return
        if isinstance(obj, (list, tuple)):
            for o in obj:
                visit(o)
        elif isinstance(obj, dict):
            for o in obj.values():
                visit(o)
        else:
            found["other"] = True

    visit(data)
    return not found["other"]
