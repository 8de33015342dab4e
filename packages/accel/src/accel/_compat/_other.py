"""Model and object helpers: unwrap a wrapped model, save and load, small formatting."""

from __future__ import annotations

import os
import platform
import socket
import warnings
from typing import Any

import torch
from torch import nn


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
    """Regional compilation, as the Accelerator does it: each repeated block (the entries of an
    `nn.ModuleList`) compiled in place; a model without repeated blocks is compiled whole."""
    from accel._dynamo import compile_blocks

    if compile_blocks(module, **compile_kwargs):
        return module
    return torch.compile(module, **compile_kwargs)


def extract_model_from_parallel(
    model: nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> nn.Module:
    """The user's model inside DDP / compile / precision wrappers."""
    from accel_precision import unwrap_forward

    compiled = model if is_compiled_module(model) else None
    inner = getattr(model, "_orig_mod", model)
    while isinstance(inner, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        inner = inner.module
    if not keep_fp32_wrapper:
        inner = unwrap_forward(inner)
    if keep_torch_compile and compiled is not None:
        compiled._orig_mod = inner
        return compiled
    return inner


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

        save_file(obj, os.fspath(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def load(f: str | os.PathLike[str], map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` with ``weights_only=True`` unless asked otherwise."""
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


def clean_state_dict_for_safetensors(
    state_dict: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Drop the duplicates of tensors that share storage (safetensors refuses them); each
    tensor left is contiguous."""
    seen: dict[tuple, str] = {}
    out = {}
    for name, tensor in state_dict.items():
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
        )
        if tensor.device.type != "meta" and key in seen:
            continue
        seen[key] = name
        out[name] = tensor.contiguous()
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
    """Warn on a Linux kernel older than 5.5 (known to hang multi-process jobs)."""
    if platform.system() != "Linux":
        return
    release = platform.release().split("-")[0].split(".")
    try:
        version = (int(release[0]), int(release[1]))
    except (ValueError, IndexError):
        return
    if version < (5, 5):
        warnings.warn(
            f"Linux kernel {platform.release()} is older than 5.5; processes may hang.",
            stacklevel=2,
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


def get_model_tp_size(model: nn.Module) -> int:
    """The tensor-parallel degree `model` was sharded with (1 when none)."""
    return int(getattr(model, "tp_size", 1) or 1)
