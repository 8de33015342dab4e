"""accelerate.checkpointing's functions: saving and loading a registered custom object, and
the whole-state steps that only Accelerator.save_state/load_state run."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from accel_parallel.checkpoint import custom_file


def save_custom_state(
    obj: Any, path: str | os.PathLike[str], index: int = 0, save_on_each_node: bool = False
) -> None:
    """Save `obj.state_dict()` as ``custom_checkpoint_<index>.pkl`` in `path`."""
    from accel._compat._utils_other import save

    save(obj.state_dict(), os.path.join(path, custom_file(index)), save_on_each_node)


def load_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0) -> None:
    """Load what `save_custom_state` wrote into `obj`."""
    obj.load_state_dict(
        torch.load(
            os.path.join(path, custom_file(index)),
            map_location="cpu",
            weights_only=False,
        )
    )


def _whole_state(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{name} is the internal step of Accelerator.save_state/load_state; call "
            "accelerator.save_state(output_dir) / accelerator.load_state(input_dir) instead."
        )

    fail.__name__ = name
    return fail


save_accelerator_state = _whole_state("save_accelerator_state")
load_accelerator_state = _whole_state("load_accelerator_state")
