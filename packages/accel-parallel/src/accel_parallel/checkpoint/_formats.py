"""What a save_state folder holds for one model or optimizer: a folder's kind picks its loader.

- ``FULL``: one full copy (``model.safetensors`` / ``pytorch_model.bin``; ``optimizer.bin``);
- ``FSDP_FULL``: FSDP2's gathered file (``pytorch_model_fsdp.bin``);
- ``DCP``: FSDP2's or a device mesh's DCP folders (``pytorch_model_fsdp_<i>/``,
  ``optimizer_<i>/``), keyed as the sharded model's state dict;
- ``PIPELINE``: a pipeline run's DCP folders (``model_fsdp/``, ``optimizer_fsdp/``), keyed by
  the model's own names, the optimizer flattened per parameter name.
"""

from __future__ import annotations

from pathlib import Path

from accel_parallel.checkpoint._layout import (
    fsdp_model_file,
    fsdp_model_folder,
    fsdp_optimizer_folder,
    optimizer_file,
    pipeline_folder,
    weights_file,
)

FULL = "full"
FSDP_FULL = "fsdp_full"
DCP = "dcp"
PIPELINE = "pipeline"


def model_format(directory: Path, name: str) -> tuple[str, Path] | None:
    """(kind, path) of what `directory` holds for model `name` (None: nothing)."""
    candidates = (
        (PIPELINE, directory / pipeline_folder(name), Path.is_dir),
        (DCP, directory / fsdp_model_folder(name), Path.is_dir),
        (FULL, directory / weights_file(name), Path.is_file),
        (FULL, directory / weights_file(name, safe=False), Path.is_file),
        (FSDP_FULL, directory / fsdp_model_file(name), Path.is_file),
    )
    for kind, path, exists in candidates:
        if exists(path):
            return kind, path
    return None


def optimizer_format(directory: Path, name: str) -> tuple[str, Path] | None:
    """(kind, path) of what `directory` holds for optimizer `name` (None: nothing)."""
    candidates = (
        (FULL, directory / optimizer_file(name), Path.is_file),
        (PIPELINE, directory / pipeline_folder(name), Path.is_dir),
        (DCP, directory / fsdp_optimizer_folder(name), Path.is_dir),
    )
    for kind, path, exists in candidates:
        if exists(path):
            return kind, path
    return None
