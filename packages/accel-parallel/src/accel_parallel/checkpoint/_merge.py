"""`merge_fsdp_weights`: a sharded FSDP2 model save (a DCP folder) into one weights file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from accel_parallel.checkpoint._layout import FSDP_MODEL_NAME


def _sharded_model_folder(source: Path) -> Path:
    if (source / ".metadata").is_file():
        return source
    found = sorted(p for p in source.glob(f"{FSDP_MODEL_NAME}_*") if (p / ".metadata").is_file())
    if len(found) == 1:
        return found[0]
    names = [p.name for p in found] or "none"
    raise FileNotFoundError(
        f"merge_fsdp_weights: {source} is not a sharded model folder (no .metadata), and it "
        f"holds {names} sharded model folders; pass one of them (e.g. "
        f"{source}/{FSDP_MODEL_NAME}_0, where save_state under FSDP2 with "
        f"SHARDED_STATE_DICT writes the first model)."
    )


def merge_fsdp_weights(
    checkpoint_dir: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """Turn a sharded FSDP2 model save into one weights file, in one process.

    `checkpoint_dir` is a model's DCP folder (``ckpt/pytorch_model_fsdp_0``, as save_state
    writes it under ``SHARDED_STATE_DICT``), or the checkpoint folder holding exactly one of
    them. Writes ``output_path/model.safetensors`` (``pytorch_model.bin`` with
    `safe_serialization=False`) and returns the folder. In a distributed run only process 0
    writes and the others wait for it.
    """
    import torch.distributed as dist

    for path in (checkpoint_dir, output_path):
        if "://" in os.fspath(path) and not os.fspath(path).startswith("file://"):
            raise ValueError(
                f"merge_fsdp_weights takes local folders, and {os.fspath(path)!r} is a URL: "
                f"run `accel merge-weights CHECKPOINT_DIR OUTPUT`, which takes store URLs."
            )
    source = _sharded_model_folder(Path(checkpoint_dir))
    out = Path(output_path)
    target = out / ("model.safetensors" if safe_serialization else "pytorch_model.bin")
    if not dist.is_initialized() or dist.get_rank() == 0:
        weights = _read_sharded(source)
        out.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.incomplete")
        if safe_serialization:
            try:
                from safetensors.torch import save_file
            except ImportError as err:
                raise ImportError(
                    "merge_fsdp_weights writes safetensors with the safetensors package: "
                    "pip install safetensors (or pass safe_serialization=False)."
                ) from err
            tensors = {k: v.contiguous() for k, v in weights.items()}
            save_file(tensors, os.fspath(tmp), metadata={"format": "pt"})
        else:
            torch.save(weights, tmp)
        tmp.replace(target)
        if remove_checkpoint_dir:
            shutil.rmtree(Path(checkpoint_dir))
    if dist.is_initialized():
        dist.barrier()
    return out


def _read_sharded(source: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP model folder, with no process group."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict = {}
    # The empty-state-dict planner reads every tensor the folder holds (as torch's own
    # dcp_to_torch_save does).
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(source),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    weights = state["model"] if set(state) == {"model"} else state
    if not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise ValueError(
            f"merge_fsdp_weights: {source} does not hold model weights (an optimizer folder?); "
            f"pass the model's folder ({FSDP_MODEL_NAME}_<i>)."
        )
    return weights
