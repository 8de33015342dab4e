"""The files of a save_state folder: accelerate's layout, plus accel's extras.

accelerate's files, which either library reads (for each model, optimizer, scheduler the
first has the plain name, the next ones ``_1``, ``_2``, ...):

- ``model.safetensors`` / ``pytorch_model.bin`` (one full copy), or the engine's own files:
  FSDP2 ``pytorch_model_fsdp_0/`` + ``optimizer_0/`` (sharded) or ``pytorch_model_fsdp.bin``
  (full), DeepSpeed's tag folder ``pytorch_model/``;
- ``optimizer.bin``, ``scheduler.bin``, ``scaler.pt`` (when there is a loss scaler),
  ``custom_checkpoint_<i>.pkl`` (registered objects);
- ``random_states_<rank>.pkl`` per process: the step counter and every RNG.

accel's extras, which accelerate ignores:

- ``accel_process_<rank>.pt`` per process: each prepared dataloader's exact position, the
  gradient-accumulation state and, in the middle of an accumulation, the gradients;
- ``accel_checkpoint.json``, written last: the completion marker, with the number of
  processes, the data-parallel size and mesh the run had, and what was saved.

A folder without the marker is accelerate's: it is complete when accelerate's last per-run
file, ``random_states_0.pkl``, is there (accelerate writes it after the weights, optimizers and
schedulers).
"""

from __future__ import annotations

import codecs
import random
import re
import warnings
from pathlib import Path
from typing import Any

import torch

MARKER = "accel_checkpoint.json"
FORMAT_VERSION = 2
CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")
# Automatic checkpoints are written here (beside `checkpoints/`) and renamed into it when
# complete: `checkpoints/` only ever holds complete folders, which is what accelerate's
# load_state (which takes the highest number there) needs after an interrupted save.
STAGING = ".accel_incomplete_checkpoints"


def rng_file(rank: int) -> str:
    return f"random_states_{rank}.pkl"


def process_file(rank: int) -> str:
    return f"accel_process_{rank}.pt"


def indexed(base: str, index: int) -> str:
    return base if index == 0 else f"{base}_{index}"


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
    return max(1, len(list(folder.glob("random_states_*.pkl"))))


# -- RNG, in accelerate's random_states_<rank>.pkl -------------------------------------------
def rng_state(step: int) -> dict[str, Any]:
    """This process's step counter and every RNG, under accelerate's keys."""
    state: dict[str, Any] = {
        "step": step,
        "random_state": random.getstate(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    try:
        import numpy as np

        state["numpy_random_seed"] = np.random.get_state()
    except ImportError:
        pass
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        kind = acc.current_accelerator().type
        state[f"torch_{kind}_manual_seed"] = torch.get_device_module(kind).get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["random_state"])
    if "numpy_random_seed" in state:
        import numpy as np

        np.random.set_state(state["numpy_random_seed"])
    torch.set_rng_state(state["torch_manual_seed"])
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        kind = acc.current_accelerator().type
        if f"torch_{kind}_manual_seed" in state:
            torch.get_device_module(kind).set_rng_state_all(state[f"torch_{kind}_manual_seed"])


def _numpy_globals() -> list[Any]:
    """What an RNG file needs beyond tensors: numpy's state array (no arbitrary objects)."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    uint32 = np.dtype(np.uint32)
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(uint32), codecs.encode]


def load_rng_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"the checkpoint is missing {path.name} (in {path.parent})")
    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


def load_file(path: Path, trusted: bool = False) -> Any:
    """torch.load with weights_only; `trusted` files fall back to full unpickling, saying so."""
    if not path.exists():
        raise FileNotFoundError(f"the checkpoint is missing {path.name} (in {path.parent})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        if not trusted:
            raise
        warnings.warn(
            f"{path.name} holds objects beyond tensors and plain values; loading it with full "
            f"unpickling (only load checkpoints you trust).",
            stacklevel=3,
        )
        return torch.load(path, map_location="cpu", weights_only=False)
