"""accel-parallel's checkpoint layout: every file name of a save_state folder (accelerate's
names and accel's extras), the merge of a sharded FSDP2 model save, and the DCP planners that
every sharded save and load uses (linear on the coordinator at any world size). The formats
that read and write these files are the strategies' (full files, DCP folders, DeepSpeed's tag
folders).
"""

from typing import Any

from accel_parallel.checkpoint._dcp import dcp_data_in_store
from accel_parallel.checkpoint._layout import (
    CHECKPOINT_RE,
    CHECKPOINTS_FOLDER,
    CUSTOM_NAME,
    CUSTOM_RE,
    DCP_INDEX,
    FORMAT_VERSION,
    FSDP_MODEL_NAME,
    MARKER,
    MODEL_NAME,
    OPTIMIZER_NAME,
    PROCESS_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    STAGING,
    STORE_SENTINEL,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
    checkpoint_folder,
    checkpoints_root,
    complete_checkpoints,
    custom_file,
    engine_tag,
    fsdp_model_file,
    fsdp_model_folder,
    fsdp_optimizer_folder,
    indexed,
    is_complete,
    model_name,
    name_index,
    optimizer_file,
    optimizer_name,
    pipeline_folder,
    process_file,
    replaced_path,
    rng_file,
    saved_processes,
    scheduler_file,
    staging_path,
    weights_file,
    written_flag,
)
from accel_parallel.checkpoint._merge import merge_fsdp_weights

__all__ = [
    "CHECKPOINTS_FOLDER",
    "CHECKPOINT_RE",
    "CUSTOM_NAME",
    "CUSTOM_RE",
    "DCP_INDEX",
    "FORMAT_VERSION",
    "FSDP_MODEL_NAME",
    "MARKER",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROCESS_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "STAGING",
    "STORE_SENTINEL",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "LoadPlanner",
    "SavePlanner",
    "checkpoint_folder",
    "checkpoints_root",
    "complete_checkpoints",
    "custom_file",
    "dcp_data_in_store",
    "engine_tag",
    "fsdp_model_file",
    "fsdp_model_folder",
    "fsdp_optimizer_folder",
    "indexed",
    "is_complete",
    "merge_fsdp_weights",
    "model_name",
    "name_index",
    "optimizer_file",
    "optimizer_name",
    "pipeline_folder",
    "process_file",
    "replaced_path",
    "rng_file",
    "saved_processes",
    "scheduler_file",
    "staging_path",
    "weights_file",
    "written_flag",
]

# imported on first use: torch.distributed.checkpoint's planners cost a second of import
_LAZY = frozenset({"LoadPlanner", "SavePlanner"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'accel_parallel.checkpoint' has no attribute {name!r}")
    from accel_parallel.checkpoint import _planners

    value = getattr(_planners, name)
    globals()[name] = value
    return value
