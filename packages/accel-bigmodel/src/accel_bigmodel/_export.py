"""Writing a model's weights: one file, or shards with an index json, as `load_checkpoint_in_model`
reads them.

`save_sharded_weights` writes ``model.safetensors``, or ``model-00001-of-0000n.safetensors``
... with ``model.safetensors.index.json`` mapping each tensor to its shard (``pytorch_model*``
names in torch's format): the folder accelerate's `save_model` writes. Tied tensors are written
once. `save_weights_file` writes one file, recording in its metadata the tied names it dropped,
which `load_weights_file` restores. Every file is flushed to disk before the call returns.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import torch

from accel_bigmodel._sizes import convert_file_size_to_int

_ALIASES_KEY = "accel_aliases"
# (stem, suffix) of the files of each format: safetensors, then torch's
_SAFE = ("model", ".safetensors")
_TORCH = ("pytorch_model", ".bin")


def _dedupe_shared(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that alias an earlier one (tied weights); return {dropped: kept}."""
    kept: dict[tuple, str] = {}
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            out[name] = tensor
            continue
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.dtype,
        )
        if key in kept:
            aliases[name] = kept[key]
        else:
            kept[key] = name
            out[name] = tensor
    return out, aliases


def save_weights_file(
    state_dict: dict[str, torch.Tensor],
    path: str | os.PathLike[str],
    safe_serialization: bool = True,
    *,
    fsync: bool = True,
) -> None:
    """Write a tensor state dict to one file: safetensors (tied tensors written once, their
    names kept in the metadata) or torch's format (where torch keeps them shared). With
    ``fsync=False`` the caller flushes the file itself."""
    if safe_serialization:
        unique, aliases = _dedupe_shared(state_dict)
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous().cpu() for k, v in unique.items()}
        save_file(
            tensors, os.fspath(path), metadata={"format": "pt", _ALIASES_KEY: json.dumps(aliases)}
        )
    else:  # a plain state dict, as accelerate writes it
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, path)
    if fsync:
        _fsync_file(path)


def load_weights_file(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Read what `save_weights_file` wrote, tied names restored (a ``.bin`` / ``.pt`` file is
    read with ``weights_only``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(os.fspath(path), framework="pt", device=str(device)) as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            aliases = json.loads((f.metadata() or {}).get(_ALIASES_KEY, "{}"))
    else:
        loaded = torch.load(path, map_location=device, weights_only=True)
        if isinstance(loaded, dict) and set(loaded) == {"state", "aliases"}:
            state, aliases = loaded["state"], loaded["aliases"]
        else:
            state, aliases = loaded, {}
    for dropped, kept in aliases.items():
        state[dropped] = state[kept]
    return state


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _plan_shards(
    state: dict[str, torch.Tensor], max_shard_size: int
) -> list[dict[str, torch.Tensor]]:
    """Split a state dict into consecutive shards of at most `max_shard_size` bytes each
    (a tensor larger than the limit gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        n = _nbytes(tensor)
        if shards[-1] and size + n > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += n
    return shards


def save_sharded_weights(
    state_dict: dict[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> None:
    """Write `state_dict` to `save_directory` as model.safetensors, or as shards of at most
    `max_shard_size` with model.safetensors.index.json (pytorch_model* names in torch's format).

    Tied tensors are written once; the index maps each written name to its shard. The files
    are written into a temporary folder beside `save_directory`, then moved into it, replacing
    an earlier export's weight files."""
    directory = Path(save_directory)
    limit = convert_file_size_to_int(max_shard_size)
    unique, _ = _dedupe_shared(state_dict)
    shards = _plan_shards(unique, limit)
    stem, suffix = _SAFE if safe_serialization else _TORCH
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.incomplete"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if len(shards) == 1:
        save_weights_file(shards[0], tmp / f"{stem}{suffix}", safe_serialization)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"{stem}-{i:05d}-of-{len(shards):05d}{suffix}"
            save_weights_file(shard, tmp / file, safe_serialization)
            weight_map.update(dict.fromkeys(shard, file))
        index = {
            "metadata": {"total_size": sum(_nbytes(t) for t in unique.values())},
            "weight_map": weight_map,
        }
        index_path = tmp / f"{stem}{suffix}.index.json"
        index_path.write_text(json.dumps(index, indent=2))
        _fsync_file(index_path)
    _fsync_dir(tmp)
    if directory.exists():
        for stale in directory.glob(f"{stem}*{suffix}*"):  # an earlier export's shards
            stale.unlink()
        for entry in tmp.iterdir():
            entry.replace(directory / entry.name)
        tmp.rmdir()
    else:
        tmp.rename(directory)
    _fsync_dir(directory.parent)


def _fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# A folder's fsync that the file system or platform does not support (not a failed write).
_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES}


def _fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename into it) to disk; nothing where the platform cannot
    (Windows, some network file systems); an I/O error is raised, naming the folder."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        if os.name == "nt" or err.errno in _UNSUPPORTED | {errno.EISDIR}:
            return
        raise OSError(err.errno, f"could not open folder {path} to flush it: {err}") from err
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _UNSUPPORTED:
            raise OSError(err.errno, f"flushing folder {path} to disk failed: {err}") from err
    finally:
        os.close(fd)
