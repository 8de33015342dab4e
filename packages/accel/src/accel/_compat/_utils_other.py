"""accelerate.utils.other's model and object helpers: unwrap a wrapped model, save and load,
small formatting."""

from __future__ import annotations

import logging
import os
import platform
import re
import socket
import types
from typing import Any

import torch
from torch import nn

_log = logging.getLogger("accel.utils.other")


def is_compiled_module(module: Any) -> bool:
    """True for the module `torch.compile` returns."""
    return hasattr(torch, "_dynamo") and isinstance(
        module, torch._dynamo.eval_frame.OptimizedModule
    )


def has_compiled_regions(module: nn.Module) -> bool:
    """True when some submodule of `module` was compiled on its own (wrapped or in place)."""
    return any(
        is_compiled_module(m) or getattr(m, "_compiled_call_impl", None) is not None
        for m in module.modules()
        if m is not module
    )


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """A twin of `module` with each repeated block compiled on its own (accel._dynamo)."""
    from accel._dynamo import compile_regions as twin

    return twin(module, **compile_kwargs)


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """`compile_regions` in place (`module.compile()`), so that FSDP2's hooks added afterwards
    still run; returns `module`."""
    from accel._dynamo import compile_regions_in_place

    return compile_regions_in_place(module, **compile_kwargs)


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> None:
    """`compile_regions` in place, for a DeepSpeed engine's `module` (its hooks stay on the
    call path); returns None, as accelerate's does."""
    from accel._dynamo import compile_regions_in_place

    compile_regions_in_place(module, **compile_kwargs)


def extract_model_from_parallel(
    model: nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> nn.Module:
    """The user's model inside DDP / compile / precision wrappers."""
    from accel_parallel import unwrap_parallel
    from accel_precision import unwrap_forward

    compiled = model if is_compiled_module(model) else None
    inner = unwrap_parallel(model)  # what the strategies unwrap
    if not keep_fp32_wrapper:
        inner = _restore_original_forward(unwrap_forward(inner))
    if keep_torch_compile and compiled is not None:
        compiled._orig_mod = inner
        return compiled
    return inner


def _restore_original_forward(model: nn.Module) -> nn.Module:
    """Undo forward wrappers a user stacked by hand (accelerate's convention): when the model
    keeps its bare forward as `_original_forward`, peel `__wrapped__` layers down to it."""
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return model
    forward = model.forward
    while hasattr(forward, "__wrapped__") and forward != original:
        forward = forward.__wrapped__
    model.forward = types.MethodType(getattr(forward, "__func__", forward), model)
    return model


def save(obj: Any, f: str | os.PathLike[str], save_on_each_node: bool = False,
         safe_serialization: bool = False) -> None:  # fmt: skip
    """Save `obj` once per machine (`save_on_each_node`) or once in all (safetensors when asked)."""
    from accel_state import PartialState

    state = PartialState()
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if not writer:
        return
    if safe_serialization:
        from safetensors.torch import save_file

        if isinstance(obj, dict):
            obj = clean_state_dict_for_safetensors(obj)
        save_file(obj, os.fspath(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def load(f: str | os.PathLike[str], map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` with ``weights_only=True`` unless asked otherwise; numpy arrays (RNG states)
    are allowed through (`TORCH_SAFE_GLOBALS`)."""
    kwargs.setdefault("weights_only", True)
    if not kwargs["weights_only"]:
        return torch.load(f, map_location=map_location, **kwargs)
    with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
        return torch.load(f, map_location=map_location, **kwargs)


def clean_state_dict_for_safetensors(
    state_dict: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Drop the duplicates of tensors that share storage (safetensors refuses them); each
    tensor left is contiguous."""
    seen: dict[tuple, str] = {}
    out = {}
    removed: list[str] = []
    for name, tensor in state_dict.items():
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
        )
        if tensor.device.type != "meta" and key in seen:
            removed.append(name)
            continue
        seen[key] = name
        out[name] = tensor.contiguous()
    if removed:
        _log.warning(
            f"Removed shared tensor {set(removed)} while saving (safetensors stores each storage "
            f"once); they are tied again when the model loads. Check that loading warns of no "
            f"missing keys."
        )
    return out


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge `source` into `destination` recursively (nested dicts merged, values replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def get_pretty_name(obj: Any) -> str:
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return str(getattr(obj, "__qualname__", getattr(obj, "__name__", obj)))


def convert_bytes(size: float) -> str:
    """`size` in bytes as a readable string ("1.5 KB")."""
    for unit in ["bytes", "KB", "MB", "GB", "TB"]:
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def is_port_in_use(port: int | None = None) -> bool:
    port = port or 29500
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port)) == 0


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path ("layer.0.weight")."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def check_os_kernel() -> None:
    """Log a warning on a Linux kernel older than 5.5.0 (known to hang multi-process jobs)."""
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    version, minimum = found.group(0), "5.5.0"
    if tuple(map(int, version.split("."))) < tuple(map(int, minimum.split("."))):
        _log.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of "
            f"{minimum}; processes may hang. Upgrade the kernel to {minimum} or newer."
        )


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """The submodules of `model`, deepest first, `model` last."""
    order: list[tuple[str, nn.Module]] = []

    def visit(name: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)
        order.append((name, module))

    visit("", model)
    return order if return_fqns else [m for _, m in order]


def model_has_dtensor(model: nn.Module) -> bool:
    """True when some parameter of `model` is a DTensor (FSDP2 / tensor parallel)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel degree a transformers `model` was sharded with; None when it was not.
    Read from `model.tp_size` (transformers < 5), else `model.config.distributed_config`."""
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(config, dict):
        return config.get("tp_size")
    return getattr(config, "tp_size", None)


def get_free_port() -> int:
    """A TCP port on this machine that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _safe_globals() -> list[Any]:
    """What `torch.load(weights_only=True)` must be allowed to rebuild for the RNG states a
    checkpoint holds: numpy arrays, their dtypes, and numpy's byte-string encoder."""
    import codecs

    import numpy as np

    core = np._core if hasattr(np, "_core") else np.core
    allowed: list[Any] = [core.multiarray._reconstruct, np.ndarray, codecs.encode, np.dtype]
    if hasattr(np, "dtypes"):
        allowed.append(np.dtypes.UInt32DType)
    return allowed


TORCH_SAFE_GLOBALS: list[Any] = _safe_globals()
