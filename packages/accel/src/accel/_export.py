"""Writing model weights for inference: one file, or shards with an index json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from accel._io import dedupe_shared, save_state_dict
from accel_bigmodel import convert_file_size_to_int
from accel_parallel import fsync_dir, fsync_file


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


def merge_fsdp_weights(
    checkpoint_dir: str | Path,
    output_path: str | Path,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """Turn a sharded FSDP2 model save into plain weights, in one process (no process group).

    `checkpoint_dir` is the model's sharded folder that `save_state` wrote (`model_fsdp`,
    `model_1_fsdp`, ...), or the checkpoint folder holding exactly one of them. The weights are
    written to the folder `output_path` as model.safetensors (or shards with an index json;
    pytorch_model.bin with `safe_serialization=False`), which `load_checkpoint_and_dispatch` and
    plain safetensors read. Returns the folder written.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    source = Path(checkpoint_dir)
    if not (source / ".metadata").is_file():
        found = sorted(p for p in source.glob("*_fsdp") if (p / ".metadata").is_file())
        found = [p for p in found if p.name.startswith("model")]
        if len(found) != 1:
            names = [p.name for p in found] or "none"
            raise FileNotFoundError(
                f"merge_fsdp_weights: {source} is not a sharded model folder (no .metadata), and "
                f"it holds {names} sharded model folders; pass one of them (e.g. "
                f"{source}/model_fsdp)."
            )
        source = found[0]
    state: dict = {}
    # The empty-state-dict planner reads every tensor the folder holds (as torch's own
    # dcp_to_torch_save does), with no process group.
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(source),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    weights = state.get("model", state)
    if not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise ValueError(f"merge_fsdp_weights: {source} does not hold model weights.")
    out = Path(output_path)
    save_sharded(weights, out, "10GB", safe_serialization)
    if remove_checkpoint_dir:
        shutil.rmtree(Path(checkpoint_dir))
    return out
