"""Every file name of a save_state folder: accelerate's layout, plus accel's extras.

accelerate's files, which either library reads (of each model, optimizer and scheduler the
first has the plain name, the next ones ``_1``, ``_2``, ...):

- weights (one full copy): ``model.safetensors`` / ``pytorch_model.bin``; or the engine's own:
  FSDP2 with ``SHARDED_STATE_DICT`` one `torch.distributed.checkpoint` folder per object
  (``pytorch_model_fsdp_<i>/``, ``optimizer_<i>/``), with ``FULL_STATE_DICT`` the files
  ``pytorch_model_fsdp.bin`` / ``pytorch_model_fsdp_1.bin``; DeepSpeed its tag folder
  ``pytorch_model/`` / ``pytorch_model_1/``; a pipeline run ``model_fsdp/``, ``optimizer_fsdp/``
  (accelerate has no pipeline checkpoints to share names with);
- ``optimizer.bin``, ``scheduler.bin``, ``scaler.pt`` (when there is a loss scaler),
  ``custom_checkpoint_<i>.pkl`` (registered objects);
- ``random_states_<rank>.pkl`` per process: the step counter and every RNG.

accel's extras, which accelerate ignores:

- ``accel_process_<rank>.pt`` per process: each prepared dataloader's exact position, the
  gradient-accumulation state and, in the middle of an accumulation, the gradients;
- ``accel_checkpoint.json``, written last: the completion marker, with the number of
  processes, the data-parallel size and mesh the run had, and what was saved;
- ``.accel_chunks`` in each DCP folder: the chunk index beside DCP's ``.metadata``, from
  which a resuming rank reads only the chunks it loads (`_index`; DCP ignores it).

A folder without the marker is accelerate's: it is complete when accelerate's last per-run
file, ``random_states_0.pkl``, is there (accelerate writes it after the weights, optimizers and
schedulers). The checkpoint code names objects ``model``, ``model_1``, ``optimizer``, ...; the
functions below turn such a name into its files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# accelerate's names (also what `accelerate.utils.constants` exports)
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
CUSTOM_NAME = "custom_checkpoint"
FSDP_MODEL_NAME = "pytorch_model_fsdp"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"

# accel's extras
MARKER = "accel_checkpoint.json"
DCP_INDEX = ".accel_chunks"
FORMAT_VERSION = 2
PROCESS_NAME = "accel_process"
CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")
CUSTOM_RE = re.compile(rf"^{CUSTOM_NAME}_\d+\.pkl$")
# Automatic checkpoints are written here (beside `checkpoints/`) and renamed into it when
# complete: `checkpoints/` only ever holds complete folders, which is what accelerate's
# load_state (which takes the highest number there) needs after an interrupted save.
STAGING = ".accel_incomplete_checkpoints"
# In an object store (no rename): the first object of a save, removed once MARKER is written
STORE_SENTINEL = ".accel_incomplete"

_INDEX_RE = re.compile(r"_(\d+)$")


def indexed(base: str, index: int) -> str:
    """``base`` for the first object, ``base_<index>`` for the others (accelerate's rule)."""
    return base if index == 0 else f"{base}_{index}"


def name_index(name: str) -> int:
    """The object index in a name made by `indexed` (``model_2`` -> 2, ``model`` -> 0)."""
    match = _INDEX_RE.search(name)
    return int(match.group(1)) if match else 0


def weights_file(name: str, safe: bool = True) -> str:
    """One full copy of model `name`: ``model.safetensors`` / ``pytorch_model_1.bin``."""
    if safe:
        return f"{name}.safetensors"
    return indexed(MODEL_NAME, name_index(name)) + ".bin"


def optimizer_file(name: str) -> str:
    """A full optimizer state: ``optimizer.bin`` / ``optimizer_1.bin``."""
    return f"{name}.bin"


def scheduler_file(index: int) -> str:
    return indexed(SCHEDULER_NAME, index) + ".bin"


def custom_file(index: int) -> str:
    return f"{CUSTOM_NAME}_{index}.pkl"


def rng_file(rank: int) -> str:
    return f"{RNG_STATE_NAME}_{rank}.pkl"


def process_file(rank: int) -> str:
    return f"{PROCESS_NAME}_{rank}.pt"


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
    """The DCP folder of a pipeline run's model or optimizer (``model_fsdp``, ...)."""
    return f"{name}_fsdp"


def engine_tag(index: int) -> str:
    """The tag folder of DeepSpeed engine ``index``: ``pytorch_model`` / ``pytorch_model_<i>``."""
    return indexed(MODEL_NAME, index)


def staging_path(target: Path, automatic: bool) -> Path:
    """Where a checkpoint for `target` is written before it is renamed into place."""
    if automatic:
        return target.parent.parent / STAGING / target.name
    return target.parent / f".{target.name}.incomplete"


def is_complete(folder: Path) -> bool:
    """accel's marker is there, or (a folder accelerate wrote) its RNG file of process 0."""
    return (folder / MARKER).is_file() or (folder / rng_file(0)).is_file()


def complete_checkpoints(root: Path) -> tuple[list[Path], list[Path]]:
    """(complete checkpoint_<n> folders sorted by n, incomplete ones) under `root`."""
    complete, incomplete = [], []
    if root.is_dir():
        for entry in root.iterdir():
            if CHECKPOINT_RE.match(entry.name):
                (complete if is_complete(entry) else incomplete).append(entry)
            elif entry.name.startswith(".checkpoint_") and entry.name.endswith(".incomplete"):
                incomplete.append(entry)
    staging = root.parent / STAGING
    if staging.is_dir():
        incomplete += [p for p in staging.iterdir() if CHECKPOINT_RE.match(p.name)]
    complete.sort(key=lambda p: int(CHECKPOINT_RE.match(p.name).group(1)))
    return complete, sorted(incomplete)


def saved_processes(folder: Path, meta: dict[str, Any] | None) -> int:
    """How many processes saved `folder` (accelerate's folders: one RNG file each)."""
    if meta is not None and "num_processes" in meta:
        return int(meta["num_processes"])
    return max(1, len(list(folder.glob(f"{RNG_STATE_NAME}_*.pkl"))))


# -- automatic naming and the steps of a save ------------------------------------------------
CHECKPOINTS_FOLDER = "checkpoints"


def checkpoints_root(project_dir: str | Path) -> Path:
    """Where automatic checkpoints live: ``<project_dir>/checkpoints``."""
    return Path(project_dir) / CHECKPOINTS_FOLDER


def checkpoint_folder(iteration: int) -> str:
    """The automatic name of save number `iteration`: ``checkpoint_<iteration>``."""
    return f"checkpoint_{iteration}"


def replaced_path(target: Path) -> Path:
    """Where an older folder named as `target` is moved while the new one is renamed into
    place (then deleted)."""
    return target.parent / f".{target.name}.old"


def written_flag(rank: int) -> str:
    """The file process `rank` leaves in an asynchronous save's folder once its files are
    written (the writing process waits for every one, then removes them)."""
    return f".written_{rank}"


def model_name(index: int) -> str:
    """The name the checkpoint code gives prepared model `index`: ``model``, ``model_1``, ...
    (its files follow from it: `weights_file`, `fsdp_model_folder`, ...)."""
    return indexed(SAFE_MODEL_NAME, index)


def optimizer_name(index: int) -> str:
    """The name of prepared optimizer `index`: ``optimizer``, ``optimizer_1``, ... (its files:
    `optimizer_file`, `fsdp_optimizer_folder`)."""
    return indexed(OPTIMIZER_NAME, index)
