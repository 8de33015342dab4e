"""Every random generator of this process, captured and restored for a checkpoint.

The state is a dict under accelerate's keys (``step``, ``random_state``,
``torch_manual_seed``, ``numpy_random_seed`` when numpy is installed, and
``torch_<accelerator>_manual_seed`` when an accelerator exists), as accelerate stores it in
``random_states_<rank>.pkl``: either library restores the other's file.
"""

from __future__ import annotations

import codecs
import os
import random
from pathlib import Path
from typing import Any

import torch

from accel_state._devices import accelerator_entry


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
    entry = accelerator_entry()
    if entry is not None:
        state[entry.rng_key] = entry.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (numpy and the accelerator when the state has them)."""
    random.setstate(state["random_state"])
    if "numpy_random_seed" in state:
        import numpy as np

        np.random.set_state(state["numpy_random_seed"])
    torch.set_rng_state(state["torch_manual_seed"])
    entry = accelerator_entry()
    if entry is not None and entry.rng_key in state:
        entry.set_rng_state_all(state[entry.rng_key])


def _numpy_globals() -> list[Any]:
    """What an RNG file needs beyond tensors: numpy's state array (no arbitrary objects)."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    uint32 = np.dtype(np.uint32)
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(uint32), codecs.encode]


def load_rng_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an RNG file (accel's or accelerate's) without unpickling arbitrary objects: only
    tensors, plain values and numpy's state array are allowed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"the checkpoint is missing {path.name} (in {path.parent})")
    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)
