"""Writing model weights for inference: one file, or shards with an index json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from accel._io import dedupe_shared, save_state_dict
from accel_bigmodel import convert_file_size_to_int
from accel_parallel import fsync_dir, fsync_file, merge_fsdp_weights


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_shards(
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


def save_sharded(
    state: dict[str, torch.Tensor], directory: Path, max_shard_size: int | str, safe: bool
) -> None:
    """Write `state` to `directory` as model.safetensors, or model-0000i-of-0000n shards and
    model.safetensors.index.json (pytorch_model* names for the .bin format). Tied tensors are
    written once; the index maps each written name to its shard. The folder is filled in a
    temporary folder and renamed into place."""
    limit = convert_file_size_to_int(max_shard_size)
    unique, _ = dedupe_shared(state)
    shards = plan_shards(unique, limit)
    stem, suffix = ("model", ".safetensors") if safe else ("pytorch_model", ".bin")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.incomplete"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if len(shards) == 1:
        save_state_dict(shards[0], tmp / f"{stem}{suffix}", safe)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"{stem}-{i:05d}-of-{len(shards):05d}{suffix}"
            save_state_dict(shard, tmp / file, safe)
            weight_map.update(dict.fromkeys(shard, file))
        index = {
            "metadata": {"total_size": sum(_nbytes(t) for t in unique.values())},
            "weight_map": weight_map,
        }
        index_path = tmp / f"{stem}{suffix}.index.json"
        index_path.write_text(json.dumps(index, indent=2))
        fsync_file(index_path)
    fsync_dir(tmp)
    if directory.exists():
        for stale in directory.glob(f"{stem}*{suffix}*"):  # an earlier export's shards
            stale.unlink()
        for entry in tmp.iterdir():
            entry.replace(directory / entry.name)
        tmp.rmdir()
    else:
        tmp.rename(directory)
    fsync_dir(directory.parent)


__all__ = ["merge_fsdp_weights", "plan_shards", "save_sharded"]
