"""Automatic checkpoint naming: ``<project_dir>/checkpoints/checkpoint_<n>``, the newest
complete one, the number of the next, and the `total_limit` rotation.

The folder names are accel-parallel's (`accel_parallel.checkpoint`); this module only applies
the ProjectConfiguration to them.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from accel_parallel.checkpoint import (
    CHECKPOINT_RE,
    checkpoint_folder,
    checkpoints_root,
    complete_checkpoints,
)


def checkpoint_root(project: Any) -> Path:
    """Where `project` (a ProjectConfiguration) keeps its automatic checkpoints."""
    if project.project_dir is None:
        raise ValueError(
            "automatic_checkpoint_naming needs a project directory: pass project_dir= to "
            "the Accelerator (or ProjectConfiguration(project_dir=...))."
        )
    return checkpoints_root(project.project_dir)


def save_target(project: Any, output_dir: str | os.PathLike[str] | None) -> Path:
    """The folder a save_state(output_dir) call writes: the next automatic name, or
    `output_dir` (exactly one of the two applies)."""
    if project.automatic_checkpoint_naming:
        if output_dir is not None:
            raise ValueError(
                "automatic_checkpoint_naming is on: call save_state() without output_dir "
                f"(got {output_dir!r})."
            )
        return checkpoint_root(project) / checkpoint_folder(project.iteration)
    if output_dir is None:
        raise ValueError(
            "save_state() needs output_dir, or ProjectConfiguration("
            "automatic_checkpoint_naming=True) with a project_dir."
        )
    return Path(output_dir)


def newest_checkpoint(project: Any, warn: bool, stacklevel: int) -> Path:
    """The newest complete automatic checkpoint; with `warn`, the incomplete ones (a save
    that was interrupted) are named in a warning."""
    root = checkpoint_root(project)
    complete, incomplete = complete_checkpoints(root)
    if incomplete and warn:
        warnings.warn(
            f"load_state: ignoring incomplete checkpoints (a save was interrupted): "
            f"{[p.name for p in incomplete]}",
            stacklevel=stacklevel + 1,
        )
    if not complete:
        raise FileNotFoundError(f"load_state(): no complete checkpoint under {root}.")
    return complete[-1]


def has_checkpoint(project: Any) -> bool:
    """Whether there is a complete automatic checkpoint to resume."""
    return bool(complete_checkpoints(checkpoint_root(project))[0])


def continue_numbering(project: Any, source: Path) -> None:
    """After loading `source`, the next automatic save follows it (checkpoint_<n+1>)."""
    match = CHECKPOINT_RE.match(source.name)
    if project.automatic_checkpoint_naming and match:
        project.iteration = int(match.group(1)) + 1


def rotate(root: Path, limit: int | None) -> None:
    """Keep the `limit` newest complete checkpoints under `root` (all with None)."""
    if limit is None:
        return
    complete, _ = complete_checkpoints(root)
    for old in complete[: max(len(complete) - limit, 0)]:
        shutil.rmtree(old)
