"""The names of checkpoint files, and the merge of a sharded FSDP2 model save.

A checkpoint folder has accelerate's layout, so that either library resumes the other's
checkpoints and tools written for accelerate find their files:

- weights of model ``i`` (one full copy): ``model.safetensors`` / ``model_1.safetensors``, or
  ``pytorch_model.bin`` / ``pytorch_model_1.bin`` without safetensors;
- optimizer ``i``: ``optimizer.bin`` / ``optimizer_1.bin``;
- FSDP2 with ``SHARDED_STATE_DICT``: one `torch.distributed.checkpoint` folder per object,
  ``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/``; with ``FULL_STATE_DICT`` the files
  ``pytorch_model_fsdp.bin`` / ``pytorch_model_fsdp_1.bin`` and ``optimizer.bin``;
- DeepSpeed: the engine's own tag folder ``pytorch_model/`` / ``pytorch_model_1/``.

The checkpoint code names objects ``model``, ``model_1``, ``optimizer``, ... and each strategy
turns such a name into its files with the functions below.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

FSDP_MODEL_NAME = "pytorch_model_fsdp"
MODEL_BIN_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"

_INDEX_RE = re.compile(r"_(\d+)$")


def indexed(base: str, index: int) -> str:
    """``base`` for the first object, ``base_<index>`` for the others (accelerate's rule)."""
    return base if index == 0 else f"{base}_{index}"


def name_index(name: str) -> int:
    """The object index in a name made by `indexed` (``model_2`` -> 2, ``model`` -> 0)."""
    match = _INDEX_RE.search(name)
    return int(match.group(1)) if match else 0


def fsdp_model_folder(name: str) -> str:
    """The DCP folder of a sharded FSDP2 model: ``pytorch_model_fsdp_<i>``."""
    return f"{FSDP_MODEL_NAME}_{name_index(name)}"


def fsdp_model_file(name: str) -> str:
    """The full-state file of an FSDP2 model: ``pytorch_model_fsdp.bin`` / ``..._<i>.bin``."""
    return indexed(FSDP_MODEL_NAME, name_index(name)) + ".bin"


def fsdp_optimizer_folder(name: str) -> str:
    """The DCP folder of a sharded FSDP2 optimizer: ``optimizer_<i>``."""
    return f"{OPTIMIZER_NAME}_{name_index(name)}"


def pipeline_folder(name: str) -> str:
    """The DCP folder of a pipeline run's model or optimizer (``model_fsdp``, ...): accelerate
    has no pipeline checkpoints to share names with."""
    return f"{name}_fsdp"


def engine_tag(index: int) -> str:
    """The tag folder of DeepSpeed engine ``index``: ``pytorch_model`` / ``pytorch_model_<i>``."""
    return indexed(MODEL_BIN_NAME, index)


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
