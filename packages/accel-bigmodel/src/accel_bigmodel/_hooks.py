"""Hooks around a module's forward, and the hook that runs a block on its execution device.

`add_hook_to_module` swaps the instance's ``forward`` for one that calls the hook before and
after the original; `remove_hook_from_module` puts the original back. The attribute names
(``_hf_hook``, ``_old_forward``) are the ones code written for accelerate looks for.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel._device_kinds import is_host
from accel_bigmodel._offload import PrefixedDataset
from accel_bigmodel._quant_params import (
    INT8_LINEAR,
    empty_meta,
    is_quantized_param,
    rebuild,
    release_int8_state,
    stats_keys,
)
from accel_bigmodel._sizes import torch_device


class ModelHook:
    """Base hook: each method may be overridden; the defaults change nothing."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called once when the hook is attached."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called before the forward with its inputs; returns the inputs to use."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward with its output; returns the output to give back."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed: undo what `init_hook` did."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (post_forward in the same order, like accelerate)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run `hook` around every forward of `module`; with `append`, after the hooks it has."""
    existing = getattr(module, "_hf_hook", None)
    if not hasattr(module, "_old_forward"):
        module._old_forward = module.forward
    elif existing is not None and not append:
        existing.detach_hook(module)
    module = hook.init_hook(module)
    if append and existing is not None:
        hooks = existing.hooks if isinstance(existing, SequentialHook) else [existing]
        hook = SequentialHook(*hooks, hook)
    module._hf_hook = hook
    forward = functools.partial(_hooked_forward, module)
    module.forward = functools.update_wrapper(forward, module._old_forward)
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hooks of `module` (and of its submodules with `recurse`), restoring forward."""
    hook = getattr(module, "_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
        del module._hf_hook
    if hasattr(module, "_old_forward"):
        old = module._old_forward
        del module._old_forward
        bound_to_class = getattr(old, "__self__", None) is module and getattr(
            old, "__func__", None
        ) is getattr(type(module), "forward", None)
        if bound_to_class:
            module.__dict__.pop("forward", None)
        else:
            module.forward = old
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def send_to_device(data: Any, device: torch.device | str | int | None, non_blocking: bool = False,
                   skip_keys: list[str] | str | None = None) -> Any:  # fmt: skip
    """`data` with every tensor inside lists, tuples and dicts moved to `device`."""
    if device is None:
        return data
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(send_to_device(x, device, non_blocking) for x in data))
    if isinstance(data, (list, tuple)):
        return type(data)(send_to_device(x, device, non_blocking) for x in data)
    if isinstance(data, Mapping):
        skip = [skip_keys] if isinstance(skip_keys, str) else skip_keys or []
        return type(data)(
            {
                k: v if k in skip else send_to_device(v, device, non_blocking)
                for k, v in data.items()
            }
        )
    return data


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in `data`."""
    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data
    if isinstance(values, (list, tuple, type({}.values()))):
        for item in values:
            device = find_device(item)
            if device is not None:
                return device
    return None


def _device(device: torch.device | str | int | None) -> torch.device | None:
    return None if device is None else torch_device(device)


def place_module(
    module: nn.Module, device: torch.device, memo: dict | None = None, recurse: bool = True
) -> None:
    """Move the tensors of `module` to `device`, keeping tensors that are shared shared."""
    memo = {} if memo is None else memo
    for sub in module.modules() if recurse else [module]:
        for store in (sub._parameters, sub._buffers):
            for name, tensor in store.items():
                if tensor is None or tensor.device == device:
                    continue
                if tensor.device.type == "meta":
                    continue
                key = (id(tensor), device)
                if key not in memo:
                    moved = tensor.data.to(device)
                    if isinstance(tensor, nn.Parameter):
                        moved = nn.Parameter(moved, requires_grad=tensor.requires_grad)
                    memo[key] = (tensor, moved)  # keep `tensor` alive so its id stays unique
                store[name] = memo[key][1]


class AlignDevicesHook(ModelHook):
    """Run a module on `execution_device`: move its inputs there, and its weights too.

    Without `offload`, the weights are moved once when the hook is attached. With `offload`,
    they stay in `weights_map` (CPU tensors or memory-mapped disk tensors), the module holds
    meta tensors, and each forward loads them onto the execution device and drops them after.
    Buffers are offloaded only with `offload_buffers`; otherwise they keep their values on the
    execution device. `place_submodules` applies all this to the submodules too (a block).
    """

    def __init__(
        self,
        execution_device: torch.device | str | int | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: list[str] | str | None = None,
        tied_params_map: dict | None = None,
    ) -> None:
        self.execution_device = _device(execution_device)
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = {} if tied_params_map is None else tied_params_map
        self.input_device: torch.device | None = None
        self.prefetcher = None  # set by a Prefetcher when weights are fetched ahead on CUDA
        self._slots: list[tuple[str, list[tuple[dict, str]], torch.Tensor]] = []
        self._stats: dict[str, list[str]] = {}  # quantized weight -> keys of its statistics
        self._int8_layers: list[nn.Module] = []
        # On the CPU a weight read from the map is the map's own view, the same each forward:
        # its Parameter is made once (name -> (value, parameter)). Never on another device,
        # where it would keep the block's copy alive between forwards.
        self._wrapped: dict[str, tuple[torch.Tensor, nn.Parameter]] = {}

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules})"
        )

    def _tensors(self, module: nn.Module, buffers: bool) -> dict[str, list[tuple[dict, str]]]:
        """name -> the (store, attr) slots that hold it; tied tensors share one name."""
        found: dict[int, tuple[str, list[tuple[dict, str]]]] = {}
        subs = module.named_modules() if self.place_submodules else [("", module)]
        for prefix, sub in subs:
            stores = [sub._parameters] + ([sub._buffers] if buffers else [])
            for store in stores:
                for attr, tensor in store.items():
                    if tensor is None:
                        continue
                    name = f"{prefix}.{attr}" if prefix else attr
                    found.setdefault(id(tensor), (name, []))[1].append((store, attr))
        return dict(found.values())

    def init_hook(self, module: nn.Module) -> nn.Module:
        device = self.execution_device
        if not self.offload:
            if device is not None:
                memo = self.tied_params_map.setdefault("memo", {})
                place_module(module, device, memo, recurse=self.place_submodules)
            return module
        slots = self._tensors(module, self.offload_buffers)
        if self.weights_map is None:
            self.weights_map = {n: s[0][0][s[0][1]].detach().to("cpu") for n, s in slots.items()}
        self._slots = []
        for name, places in slots.items():
            store, attr = places[0]
            current = store[attr]
            shared = self.tied_params_map.setdefault("meta", {})  # one meta tensor per tie
            known = shared.get(id(current))
            if known is not None and known[0]() is current:
                meta = known[1]
            elif is_quantized_param(current):
                meta = empty_meta(current)
                shared[id(current)] = (weakref.ref(current), meta)
            else:
                meta = current.to("meta")
                if isinstance(current, nn.Parameter):
                    meta = nn.Parameter(meta, requires_grad=current.requires_grad)
                shared[id(current)] = (weakref.ref(current), meta)  # never keeps data alive
            for s, a in places:
                s[a] = meta
            self._slots.append((name, places, meta))
        self._find_quantized(module)
        if not self.offload_buffers and device is not None:
            for sub in module.modules() if self.place_submodules else [module]:
                for attr, buf in sub._buffers.items():
                    if buf is not None and buf.device.type != "meta":
                        sub._buffers[attr] = buf.to(device)
        return module

    def _find_quantized(self, module: nn.Module) -> None:
        """Note the quantized weights among the slots, with the keys of their statistics."""
        quantized = [(n, m) for n, _, m in self._slots if is_quantized_param(m)]
        keys = list(self.weights_map) if quantized else []
        self._stats = {n: stats_keys(n, m, keys) for n, m in quantized}
        subs = module.modules() if self.place_submodules else [module]
        self._int8_layers = (
            [s for s in subs if type(s).__name__ == INT8_LINEAR] if quantized else []
        )

    def _quantized(self, name: str, meta: nn.Parameter, value: torch.Tensor) -> nn.Parameter:
        stats = {k: self.weights_map[k].to(value.device) for k in self._stats[name]}
        return rebuild(meta, name, value, stats)

    def load_weights(self) -> dict[str, torch.Tensor]:
        """The block's weights on the execution device (read from `weights_map`)."""
        device = self.execution_device or torch.device("cpu")
        out = {}
        for name, _, meta in self._slots:
            value = self.weights_map[name]
            out[name] = value.to(device, dtype=meta.dtype if meta.is_floating_point() else None)
        return out

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            values = self.prefetcher.take(self) if self.prefetcher else self.load_weights()
            on_cpu = self.execution_device is None or is_host(self.execution_device)
            grad = torch.is_grad_enabled()
            for name, places, meta in self._slots:
                value = values[name]
                if name in self._stats:
                    value = self._quantized(name, meta, value)
                elif isinstance(meta, nn.Parameter):
                    # not where a backward would leave a .grad on it between forwards
                    reusable = on_cpu and not (grad and meta.requires_grad)
                    known = self._wrapped.get(name) if reusable else None
                    if known is not None and known[0] is value:
                        value = known[1]
                    else:
                        wrapped = nn.Parameter(value, requires_grad=meta.requires_grad)
                        if reusable:
                            self._wrapped[name] = (value, wrapped)
                        value = wrapped
                for store, attr in places:
                    store[attr] = value
        device = self.execution_device
        return send_to_device(args, device), send_to_device(
            kwargs, device, skip_keys=self.skip_keys
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for _, places, meta in self._slots:
                for store, attr in places:
                    store[attr] = meta
            release_int8_state(self._int8_layers)
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Put offloaded weights back into the module (on the CPU) so it runs without hooks."""
        if self.offload:
            for name, places, meta in self._slots:
                value = self.weights_map[name].to("cpu")
                if name in self._stats:
                    value = self._quantized(name, meta, value)
                elif isinstance(meta, nn.Parameter):
                    value = nn.Parameter(value, requires_grad=meta.requires_grad)
                for store, attr in places:
                    store[attr] = value
            self._slots = []
            self._wrapped = {}
        return module


def attach_align_device_hook(
    module: nn.Module,
    execution_device: torch.device | str | int | None = None,
    offload: bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: list[str] | str | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Attach an `AlignDevicesHook` to every submodule that holds tensors directly.

    Modules whose class name is in `preload_module_classes` get one hook for their whole
    subtree (their weights are all loaded before their forward).
    """
    preload = set(preload_module_classes or ())
    whole = type(module).__name__ in preload
    # Buffers count even when they are not offloaded: the hook moves them to the execution
    # device (a top-level buffer left on the CPU breaks the forward on a GPU).
    has_own = any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )
    if has_own or whole:
        prefix = f"{module_name}." if module_name else ""
        data = (
            PrefixedDataset(weights_map, prefix)
            if weights_map is not None and prefix
            else weights_map
        )
        hook = AlignDevicesHook(
            execution_device, offload=offload, weights_map=data, offload_buffers=offload_buffers,
            place_submodules=whole, skip_keys=skip_keys, tied_params_map=tied_params_map,
        )  # fmt: skip
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for name, child in module.named_children():
        child_name = f"{module_name}.{name}" if module_name else name
        attach_align_device_hook(
            child, execution_device, offload, weights_map, offload_buffers, child_name,
            skip_keys, preload_module_classes, tied_params_map,
        )  # fmt: skip


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: Mapping[str, Any] | torch.device | str | int | None = None,
    offload: Mapping[str, bool] | bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: list[str] | str | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Attach one `AlignDevicesHook` per block named in `execution_device` (a device map).

    Blocks with ``offload[name]`` keep their weights in `weights_map` (keys are full names)
    and load them whole before their forward. The model itself gets a hook that returns the
    output on the device the input came from.
    """
    tied_params_map = {} if tied_params_map is None else tied_params_map
    if not isinstance(execution_device, Mapping):
        if isinstance(offload, Mapping):
            execution_device = dict.fromkeys(offload, execution_device)
        else:
            hook = AlignDevicesHook(
                execution_device, offload=offload, io_same_device=True, weights_map=weights_map,
                offload_buffers=offload_buffers, place_submodules=True, skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )  # fmt: skip
            add_hook_to_module(module, hook)
            return
    if not isinstance(offload, Mapping):
        offload = dict.fromkeys(execution_device, offload)
    if module_name in execution_device and type(module).forward is nn.Module.forward:
        # A container (ModuleList, ModuleDict, any module without a forward of its own: the
        # parent calls its children) is never called, so a hook on it would never run: each
        # child gets the container's placement as a block of its own.
        children = [f"{module_name}.{name}" for name, _ in module.named_children()]
        execution_device = {
            **execution_device,
            **dict.fromkeys(children, execution_device[module_name]),
        }
        offload = {**offload, **dict.fromkeys(children, bool(offload.get(module_name)))}
        del execution_device[module_name]
    if module_name in execution_device:
        data = weights_map
        if offload.get(module_name) and module_name and weights_map is not None:
            data = PrefixedDataset(weights_map, f"{module_name}.")
        hook = AlignDevicesHook(
            execution_device[module_name], offload=bool(offload.get(module_name)),
            io_same_device=module_name == "", weights_map=data, offload_buffers=offload_buffers,
            place_submodules=True, skip_keys=skip_keys, tied_params_map=tied_params_map,
        )  # fmt: skip
        add_hook_to_module(module, hook)
        return
    if module_name == "":
        add_hook_to_module(module, AlignDevicesHook(io_same_device=True, skip_keys=skip_keys))
    for name, child in module.named_children():
        child_name = f"{module_name}.{name}" if module_name else name
        attach_align_device_hook_on_blocks(
            child, execution_device, offload, weights_map, offload_buffers, child_name,
            skip_keys, preload_module_classes, tied_params_map,
        )  # fmt: skip
