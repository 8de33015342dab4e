"""Running a model across devices: dispatch by device map, CPU offload, disk offload."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from accel_bigmodel._auto_map import resolve_device_map
from accel_bigmodel._checkpoint import load_checkpoint_in_model
from accel_bigmodel._device_kinds import copies_on_side_streams
from accel_bigmodel._device_map import check_device_map
from accel_bigmodel._hooks import (
    AlignDevicesHook,
    ModelHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    place_module,
    remove_hook_from_module,
    send_to_device,
)
from accel_bigmodel._modeling import set_module_tensor_to_device
from accel_bigmodel._offload import INDEX_NAME, OffloadedWeightsLoader, offload_state_dict
from accel_bigmodel._prefetch import Prefetcher
from accel_bigmodel._reader import CheckpointReader
from accel_bigmodel._sizes import (
    Device,
    _device_sort_key,
    check_device_exists,
    normalize_device,
    torch_device,
)


def _under(name: str, keys: Iterable[str]) -> bool:
    return any(k == "" or name == k or name.startswith(f"{k}.") for k in keys)


def _disk_loader(
    state_dict: dict[str, torch.Tensor],
    offload_dir: str | os.PathLike | None,
    offload_index: Mapping[str, dict] | None,
) -> OffloadedWeightsLoader:
    if offload_index is None and offload_dir is None:
        raise ValueError(
            "The device_map sends modules to 'disk' but neither offload_dir nor offload_index "
            "was given. Load the checkpoint with offload_folder=... and pass the same folder."
        )
    if offload_index is None and not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
        raise FileNotFoundError(f"No {INDEX_NAME} in the offload folder {offload_dir}.")
    return OffloadedWeightsLoader(state_dict, save_folder=offload_dir, index=offload_index)


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, Device],
    main_device: Device | torch.device | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike | None = None,
    offload_index: Mapping[str, dict] | None = None,
    offload_buffers: bool = False,
    skip_keys: list[str] | str | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    prefetch: bool = True,
) -> nn.Module:
    """Place `model` as `device_map` says and hook it so its forward runs across devices.

    Blocks on a GPU stay there; blocks on "cpu" or "disk" run on `main_device` (the first GPU
    of the map, else the CPU), loading their weights for each forward. When the main device
    is the CPU, "cpu" blocks simply stay in memory and "disk" blocks run from memory-mapped
    files. On CUDA, with `prefetch`, the next offloaded block's weights are copied from
    pinned memory on a side stream while the current block computes.
    """
    device_map = {k: normalize_device(v) for k, v in device_map.items()}
    check_device_map(model, device_map)
    named = {n for n, _ in model.named_modules()} | set(model.state_dict(keep_vars=True))
    device_map = {k: v for k, v in device_map.items() if k in named}  # unknown keys: warned
    for device in set(device_map.values()):
        check_device_exists(device)
    devices = set(device_map.values())
    if main_device is None:
        real = sorted((d for d in devices if d not in ("cpu", "disk")), key=_device_sort_key)
        main_device = real[0] if real else "cpu"
    main = normalize_device(main_device)
    if len(devices) == 1 and "disk" not in devices and not force_hooks:
        _place_all(model, torch_device(devices.pop()))
        model.hf_device_map = dict(device_map)
        return model
    offloaded = {k for k, v in device_map.items() if v == "disk" or (v == "cpu" and main != "cpu")}
    memory = dict(state_dict or {})
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name not in memory and _under(name, offloaded) and tensor.device.type != "meta":
            memory[name] = tensor.detach()
    weights_map: Mapping[str, torch.Tensor] = memory
    if "disk" in devices:
        disk = {k for k, v in device_map.items() if v == "disk"}
        if (
            offload_index is None
            and offload_dir is not None
            and not os.path.isfile(os.path.join(offload_dir, INDEX_NAME))
        ):
            # As accelerate does: the disk modules' weights in memory are written to the folder
            # (and then read from there, not kept in memory).
            os.makedirs(offload_dir, exist_ok=True)
            offload_state_dict(offload_dir, {n: t for n, t in memory.items() if _under(n, disk)})
            memory = {n: t for n, t in memory.items() if not _under(n, disk)}
        loader = _disk_loader(memory, offload_dir, offload_index)
        # What the folder holds for a disk module is its value: a tensor still in memory
        # there (a buffer left at its init value when the checkpoint offloaded buffers) is not.
        stale = [n for n in memory if _under(n, disk) and n in loader.index]
        if stale:
            memory = {n: t for n, t in memory.items() if n not in stale}
            loader = _disk_loader(memory, offload_dir, offload_index)
            if not offload_buffers:  # buffers stay in the module: give them the stored values
                buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
                for name in (n for n in stale if n in buffers):
                    set_module_tensor_to_device(model, name, "cpu", value=loader[name])
        if main == "cpu":
            loader.map_ahead()  # the views the forward runs on, made now (nothing is read)
        weights_map = loader
    _check_no_meta(model, device_map, offloaded, weights_map)
    execution = {k: main if k in offloaded or v == "disk" else v for k, v in device_map.items()}
    execution = {k: torch_device(v) for k, v in execution.items()}
    modules = {n for n, _ in model.named_modules()}
    for name in [k for k in device_map if k not in modules]:  # keys naming single tensors
        set_module_tensor_to_device(model, name, execution[name], value=weights_map.get(name))
    attach_align_device_hook_on_blocks(
        model, execution_device={k: v for k, v in execution.items() if k in modules},
        offload={k: k in offloaded for k in execution if k in modules}, weights_map=weights_map,
        offload_buffers=offload_buffers, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
    )  # fmt: skip
    if prefetch and copies_on_side_streams(torch_device(main)):
        Prefetcher.attach(model, torch_device(main))
    model.hf_device_map = dict(device_map)
    return model


def _place_all(model: nn.Module, device: torch.device) -> None:
    meta = [n for n, t in model.state_dict(keep_vars=True).items() if t.device.type == "meta"]
    if meta:
        raise ValueError(
            f"{len(meta)} tensor(s) of the model have no data (meta device), e.g. {meta[:10]}. "
            f"Load a checkpoint first (load_checkpoint_in_model) or check it has these keys."
        )
    place_module(model, device)


def _check_no_meta(
    model: nn.Module, device_map: Mapping[str, Device], offloaded: set[str], weights: Mapping
) -> None:
    empty = [
        n
        for n, t in model.state_dict(keep_vars=True).items()
        if t.device.type == "meta" and n not in weights
    ]
    if empty:
        raise ValueError(
            f"{len(empty)} tensor(s) of the model have no data and are not in the offloaded "
            f"weights, e.g. {empty[:10]}. Load the checkpoint (with the same device_map and "
            f"offload folder) before dispatching."
        )


def cpu_offload(
    model: nn.Module,
    execution_device: Device | torch.device | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Keep all weights on the CPU and load each module's onto `execution_device` to run it.

    Peak accelerator memory is one module's weights plus activations (two with prefetch).
    """
    device = torch_device(normalize_device(execution_device or _default_device()))
    if state_dict is None:
        state_dict = {n: t.detach().to("cpu") for n, t in model.state_dict(keep_vars=True).items()}
    # The input-device hook goes first, so it records where the caller's inputs were before
    # the model's own hook (a top-level buffer or parameter) moves them.
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model, device, offload=True, weights_map=state_dict, offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
    )  # fmt: skip
    if prefetch and copies_on_side_streams(device):
        Prefetcher.attach(model, device)
    return model


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike,
    execution_device: Device | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
    prefetch: bool = True,
) -> nn.Module:
    """Write the weights to `offload_dir` (unless an index is there) and run from those files."""
    if not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
        offload_state_dict(offload_dir, model.state_dict())
    device = torch_device(normalize_device(execution_device or _default_device()))
    loader = OffloadedWeightsLoader(save_folder=offload_dir)
    # The input-device hook goes first, so it records where the caller's inputs were before
    # the model's own hook (a top-level buffer or parameter) moves them.
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model, device, offload=True, weights_map=loader, offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
    )  # fmt: skip
    if prefetch and copies_on_side_streams(device):
        Prefetcher.attach(model, device)
    return model


def _default_device() -> Device:
    return 0 if torch.cuda.is_available() else "cpu"


class CpuOffload(ModelHook):
    """Moves the whole module to `execution_device` before its forward (after offloading the
    previous model of a chain)."""

    def __init__(
        self,
        execution_device: Device | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.execution_device = torch_device(
            normalize_device(execution_device or _default_device())
        )
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device
        )


class UserCpuOffloadHook:
    """Handle returned by `cpu_offload_with_hook`: `offload()` moves the model back to the CPU,
    `remove()` detaches the hook."""

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: Device | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Offload the whole model to the CPU; it moves to `execution_device` when called and stays
    there until `hook.offload()` or until the next model of the chain runs.

    Chain several models (a diffusion pipeline) by passing the previous hook as
    `prev_module_hook`: running a model offloads the one before it.
    """
    hook = CpuOffload(execution_device, prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: str | Mapping[str, Device] | Device | None = None,
    max_memory: Mapping[Device, int | float | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_buffers: bool = False,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: list[str] | str | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    show_progress: bool | None = None,
    prefetch: bool = True,
    reader: str | CheckpointReader = "auto",
) -> nn.Module:
    """Load `checkpoint` into `model` (usually built under `init_empty_weights`) and dispatch it.

    `device_map` is a dict, one device, or "auto" / "balanced" / "balanced_low_0" /
    "sequential" (planned from `max_memory`, by default what is free now). `reader` picks how
    the shards are read (see `load_checkpoint_in_model`).
    """
    if device_map is not None:
        device_map = resolve_device_map(
            model, device_map, max_memory, no_split_module_classes, dtype, offload_buffers,
            allow_disk=offload_folder is not None,
        )  # fmt: skip
    load_checkpoint_in_model(
        model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
        offload_state_dict=bool(offload_state_dict), offload_buffers=offload_buffers,
        strict=strict, show_progress=show_progress, reader=reader,
    )  # fmt: skip
    if device_map is None:
        return model
    return dispatch_model(
        model, device_map, offload_dir=offload_folder, offload_buffers=offload_buffers,
        skip_keys=skip_keys, preload_module_classes=preload_module_classes,
        force_hooks=force_hooks, prefetch=prefetch,
    )  # fmt: skip
