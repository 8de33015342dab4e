"""Loading a checkpoint into a (possibly empty) model, one shard at a time.

A checkpoint is one ``.safetensors`` / ``.bin`` / ``.pt`` file, a folder holding one, or a
folder with ``model.safetensors.index.json`` / ``pytorch_model.bin.index.json`` =
``{"metadata": {...}, "weight_map": {name: shard_file}}`` and the shards. Tensors are read one
at a time and placed where the device map says; tensors mapped to "disk" are not read at
all when they sit in a safetensors shard in the right dtype: the offload index points at
them in place.
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import torch
from torch import nn

from accel_bigmodel._device_map import check_device_map, device_for
from accel_bigmodel._modeling import (
    find_tied_parameters,
    retie_parameters,
    set_module_tensor_to_device,
)
from accel_bigmodel._offload import (
    dtype_name,
    offload_weight,
    safetensors_entries,
    save_offload_index,
)
from accel_bigmodel._progress import Progress
from accel_bigmodel._sizes import Device, _as_dtype, normalize_device

INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin")
_EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth")


class LoadResult(NamedTuple):
    """What `load_checkpoint_in_model` did not match: model tensors and checkpoint tensors."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _shards_from_index(index_path: str) -> list[str]:
    try:
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"Cannot read the checkpoint index {index_path}: {e!r}. It must be JSON with a "
            f'"weight_map" of tensor name -> shard file.'
        ) from None
    folder = os.path.dirname(index_path)
    shards = sorted({os.path.join(folder, f) for f in weight_map.values()})
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise FileNotFoundError(
            f"The checkpoint index {index_path} lists shard(s) that do not exist: {missing}."
        )
    return shards


def checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """The files making up `checkpoint` (a file, an index json, or a folder), in load order."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        return _shards_from_index(path) if path.endswith(".json") else [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Checkpoint {path!r} is neither a file nor a folder.")
    for name in INDEX_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return _shards_from_index(os.path.join(path, name))
    indexes = glob.glob(os.path.join(path, "*.index.json"))
    if len(indexes) == 1:
        return _shards_from_index(indexes[0])
    for name in SINGLE_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return [os.path.join(path, name)]
    files = sorted(f for f in os.listdir(path) if f.endswith(_EXTENSIONS))
    if len(files) == 1:
        return [os.path.join(path, files[0])]
    raise ValueError(
        f"Cannot tell which checkpoint to load in {path!r}: expected {INDEX_NAMES[0]}, "
        f"{INDEX_NAMES[1]}, or one weights file ({', '.join(_EXTENSIONS)}); found {files}."
    )


def _corrupt(path: str, error: BaseException) -> ValueError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ValueError(
        f"Cannot read the checkpoint shard {path} ({type(error).__name__}: {first}). The file is corrupt or truncated; "
        f"save or download it again."
    )


def _safetensors_shard(path: str) -> Iterator[tuple[str, Callable[[], torch.Tensor], dict]]:
    from safetensors import safe_open

    try:
        entries = safetensors_entries(path)
        handle = safe_open(path, framework="pt", device="cpu")
    except Exception as e:
        raise _corrupt(path, e) from e
    with handle as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)

            def read(name: str = name) -> torch.Tensor:
                try:
                    return f.get_tensor(name)
                except Exception as e:
                    raise _corrupt(path, e) from e

            yield name, read, entries.get(name)


def _torch_shard(path: str) -> Iterator[tuple[str, Callable[[], torch.Tensor], None]]:
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise _corrupt(path, e) from e
    if not isinstance(state, Mapping):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict of tensors.")
    names = list(state)
    for name in names:
        tensor = state.pop(name)
        yield name, (lambda t=tensor: t), None


def _read_shard(path: str) -> Iterator[tuple[str, Callable[[], torch.Tensor], dict | None]]:
    return _safetensors_shard(path) if path.endswith(".safetensors") else _torch_shard(path)


def _target_dtype(
    name: str,
    current: torch.Tensor,
    dtype: torch.dtype | None,
    keep_in_fp32: list[str],
) -> torch.dtype | None:
    if not current.is_floating_point():
        return None
    if keep_in_fp32 and any(m in name.split(".") for m in keep_in_fp32):
        return torch.float32
    return dtype or current.dtype


def _finish(
    model: nn.Module, missing: list[str], unexpected: list[str], strict: bool
) -> LoadResult:
    if missing or unexpected:
        message = (
            f"Checkpoint and {type(model).__name__} do not match: "
            f"missing keys {missing[:50]}{' ...' if len(missing) > 50 else ''}, "
            f"unexpected keys {unexpected[:50]}{' ...' if len(unexpected) > 50 else ''}."
        )
        if strict:
            raise ValueError(message + " Pass strict=False to load what matches.")
        warnings.warn(message, stacklevel=3)
    return LoadResult(missing, unexpected)


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: Mapping[str, Device] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    strict: bool = False,
    show_progress: bool | None = None,
) -> LoadResult:
    """Load `checkpoint` into `model` tensor by tensor, placing each as `device_map` says.

    Works on models built under `init_empty_weights`. Tensors mapped to "disk" go to
    `offload_folder` (indexed in its ``index.json``); buffers stay in memory with their stored
    values unless `offload_buffers`. Floating tensors are cast to `dtype` (or to the model's
    dtype), except in `keep_in_fp32_modules`. Tied parameters are tied again after loading.
    Missing / unexpected keys raise with `strict`, else warn. Peak memory stays near the
    model's size plus one tensor: shards are streamed, and `offload_state_dict` is accepted
    for compatibility (it has nothing left to save).
    """
    del offload_state_dict
    dtype = _as_dtype(dtype)
    files = checkpoint_files(checkpoint)
    if device_map is not None:
        device_map = {k: normalize_device(v) for k, v in device_map.items()}
        check_device_map(model, device_map)
        disk = sorted(k for k, v in device_map.items() if v == "disk")
        if disk and offload_folder is None:
            raise ValueError(
                f"The device_map sends {disk[:10]} to 'disk' but no offload_folder was given; "
                f"pass offload_folder='some/folder'."
            )
    tied = find_tied_parameters(model)
    aliases = {name: group for group in tied for name in group}
    expected = model.state_dict(keep_vars=True)
    buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
    keep_fp32 = list(keep_in_fp32_modules or ())
    loaded: set[str] = set()
    unexpected: list[str] = []
    index: dict[str, dict] = {}
    progress = Progress(len(files), "Loading checkpoint shards", show_progress)
    for path in files:
        for name, read, entry in _read_shard(path):
            current = expected.get(name)
            if current is None:
                unexpected.append(name)
                continue
            want = _target_dtype(name, current, dtype, keep_fp32)
            names = aliases.get(name, [name])
            devices = {a: _device_of(device_map, a, expected[a]) for a in names}
            in_memory = [
                a for a in names if devices[a] != "disk" or (a in buffers and not offload_buffers)
            ]
            loaded.update(names)
            if not in_memory:
                if entry is not None and (want is None or entry["dtype"] == dtype_name(want)):
                    index[name] = dict(entry)
                else:
                    value = read()
                    offload_weight(value.to(want) if want else value, name, offload_folder, index)
                for alias in names:
                    index[alias] = index[name]
                continue
            target = in_memory[0]
            device = "cpu" if devices[target] == "disk" else devices[target]
            value = read()
            if not _owns_memory(value) and (want is None or want == value.dtype):
                value = value.clone()  # detach from the file's memory map
            set_module_tensor_to_device(model, target, device, value=value, dtype=want)
        progress.update()
    _retie_loaded(model, tied)
    if index:
        save_offload_index(index, offload_folder)
    missing = [n for n in expected if n not in loaded]
    return _finish(model, missing, unexpected, strict)


def _device_of(
    device_map: Mapping[str, Device] | None, name: str, current: torch.Tensor
) -> Device | torch.device:
    if device_map is not None:
        return device_for(device_map, name)
    return "cpu" if current.device.type == "meta" else current.device


def _owns_memory(tensor: torch.Tensor) -> bool:
    """False for tensors backed by a memory-mapped file (torch.load(mmap=True))."""
    storage = tensor.untyped_storage()
    return storage.filename is None if hasattr(storage, "filename") else True


def _retie_loaded(model: nn.Module, tied: list[list[str]]) -> None:
    """Tie each group to the member that got data (the checkpoint stores ties once)."""
    from accel_bigmodel._modeling import _get_tensor

    groups = []
    for group in tied:
        real = [n for n in group if _get_tensor(model, n).device.type != "meta"]
        if real:
            groups.append([real[0]] + [n for n in group if n != real[0]])
    retie_parameters(model, groups)
