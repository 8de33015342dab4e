"""Prefetch for offloaded weights on CUDA: copy the next block while the current one runs.

Offloaded CPU weights are moved into pinned (page-locked) host memory once, so their copies
to the GPU are asynchronous. When an offloaded block starts, the copy of the next block's
weights is queued on a side stream; the next block waits on that copy's event instead of
copying synchronously. Weights read from disk are staged through pinned buffers from the
host allocator's cache. The order of blocks is learned from the first forward.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from accel_bigmodel._device_kinds import is_host
from accel_bigmodel._offload import OffloadedWeightsLoader, PrefixedDataset


def _pin_in_place(weights_map: Mapping[str, torch.Tensor], name: str) -> None:
    """Replace the CPU tensor `name` of `weights_map` by a pinned copy (once, in its store)."""
    base, key = weights_map, name
    while isinstance(base, PrefixedDataset):
        base, key = base.dataset, f"{base.prefix}{key}"
    store = base.state_dict if isinstance(base, OffloadedWeightsLoader) else base
    if not isinstance(store, dict) or key not in store:
        return
    tensor = store[key]
    if is_host(tensor.device) and not tensor.is_pinned():
        store[key] = tensor.pin_memory()


class Prefetcher:
    """Shared by the offloading hooks of one model; see the module docstring."""

    def __init__(self, hooks: list, device: torch.device) -> None:
        self.hooks = hooks
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pending: dict[int, tuple[torch.cuda.Event, dict[str, torch.Tensor]]] = {}
        self.observed: list = []
        self.learning = True
        for hook in hooks:
            hook.prefetcher = self
            for name, _, _ in hook._slots:
                _pin_in_place(hook.weights_map, name)

    @classmethod
    def attach(cls, model: nn.Module, device: torch.device) -> Prefetcher | None:
        """Link every offloading hook of `model` that runs on `device`; None if there are none."""
        hooks = []
        for module in model.modules():
            hook = getattr(module, "_hf_hook", None)
            for h in getattr(hook, "hooks", [hook]):
                if getattr(h, "offload", False) and h.execution_device == device and h._slots:
                    hooks.append(h)
        return cls(hooks, device) if hooks else None

    def _start(self, hook) -> None:
        values = {}
        with torch.cuda.stream(self.stream):
            for name, _, meta in hook._slots:
                source = hook.weights_map[name]
                if is_host(source.device) and not source.is_pinned():
                    staged = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
                    source = staged.copy_(source)
                dtype = meta.dtype if meta.is_floating_point() else None
                values[name] = source.to(self.device, dtype=dtype, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.pending[id(hook)] = (event, values)

    def _next(self, hook):
        order = self.hooks
        position = next(i for i, h in enumerate(order) if h is hook)
        return order[(position + 1) % len(order)]

    def take(self, hook) -> dict[str, torch.Tensor]:
        """The weights of `hook`'s block on the device, and queue the next block's copy."""
        if self.learning:
            if self.observed and hook is self.observed[0]:
                self.hooks, self.learning = self.observed, False
            elif all(h is not hook for h in self.observed):
                self.observed.append(hook)
        entry = self.pending.pop(id(hook), None)
        if entry is None:
            values = hook.load_weights()
        else:
            event, values = entry
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for value in values.values():
                value.record_stream(current)
        following = self._next(hook) if hook in self.hooks else None
        if following is not None and following is not hook and id(following) not in self.pending:
            self._start(following)
        return values
