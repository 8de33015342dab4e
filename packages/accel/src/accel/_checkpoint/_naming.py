"""Automatic checkpoint naming: ``<project_dir>/checkpoints/checkpoint_<n>``, the newest
complete one, the number of the next, and the `total_limit` rotation.

The folder names are accel-parallel's (`accel_parallel.checkpoint`); this module only applies
the ProjectConfiguration to them. A project_dir that is a store URL keeps its checkpoints as
prefixes in the store (str URLs where a local project has Paths): complete when accel's marker
is there, or (accelerate's, copied in) its RNG file of process 0 with no sentinel of an
interrupted save.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from accel._io import as_location, is_url
from accel_parallel.checkpoint import (
    CHECKPOINT_RE,
    CHECKPOINTS_FOLDER,
    MARKER,
    STORE_SENTINEL,
    checkpoint_folder,
    checkpoints_root,
    complete_checkpoints,
    rng_file,
)


def _name(location: Path | str) -> str:
    return location.name if isinstance(location, Path) else location.rstrip("/").rsplit("/", 1)[-1]


def _join(root: Path | str, name: str) -> Path | str:
    return root / name if isinstance(root, Path) else f"{root.rstrip('/')}/{name}"


def state_of(names: set[str] | list[str]) -> str:
    """'complete', 'interrupted' (accel's sentinel, no marker) or 'missing' for a store prefix
    holding the objects `names` (directly under it)."""
    if MARKER in names:
        return "complete"
    if STORE_SENTINEL in names:
        return "interrupted"
    return "complete" if rng_file(0) in names else "missing"


def _complete_in_store(root: str) -> tuple[list[str], list[str]]:
    from accel_bigmodel import stores

    complete, incomplete = [], []
    for name in stores.list_names(root):
        if CHECKPOINT_RE.match(name):
            url = stores.join(root, name)
            done = state_of(stores.list_names(url)) == "complete"
            (complete if done else incomplete).append(url)
    complete.sort(key=lambda u: int(CHECKPOINT_RE.match(_name(u)).group(1)))
    return complete, sorted(incomplete)


def complete_in(root: Path | str) -> tuple[list, list]:
    """(complete checkpoints sorted by number, incomplete ones) under `root`."""
    return complete_checkpoints(root) if isinstance(root, Path) else _complete_in_store(root)


def checkpoint_root(project: Any) -> Path | str:
    """Where `project` (a ProjectConfiguration) keeps its automatic checkpoints."""
    if project.project_dir is None:
        raise ValueError(
            "automatic_checkpoint_naming needs a project directory: pass project_dir= to "
            "the Accelerator (or ProjectConfiguration(project_dir=...))."
        )
    if is_url(project.project_dir):
        return f"{project.project_dir.rstrip('/')}/{CHECKPOINTS_FOLDER}"
    return checkpoints_root(project.project_dir)


def save_target(project: Any, output_dir: str | os.PathLike[str] | None) -> Path | str:
    """The folder a save_state(output_dir) call writes: the next automatic name, or
    `output_dir` (exactly one of the two applies)."""
    if project.automatic_checkpoint_naming:
        if output_dir is not None:
            raise ValueError(
                "automatic_checkpoint_naming is on: call save_state() without output_dir "
                f"(got {output_dir!r})."
            )
        return _join(checkpoint_root(project), checkpoint_folder(project.iteration))
    if output_dir is None:
        raise ValueError(
            "save_state() needs output_dir, or ProjectConfiguration("
            "automatic_checkpoint_naming=True) with a project_dir."
        )
    return as_location(output_dir)


def newest_checkpoint(project: Any, warn: bool, stacklevel: int) -> Path | str:
    """The newest complete automatic checkpoint; with `warn`, the incomplete ones (a save
    that was interrupted) are named in a warning."""
    root = checkpoint_root(project)
    complete, incomplete = complete_in(root)
    if incomplete and warn:
        warnings.warn(
            f"load_state: ignoring incomplete checkpoints (a save was interrupted): "
            f"{[_name(p) for p in incomplete]}",
            stacklevel=stacklevel + 1,
        )
    if not complete:
        raise FileNotFoundError(f"load_state(): no complete checkpoint under {root}.")
    return complete[-1]


def has_checkpoint(project: Any) -> bool:
    """Whether there is a complete automatic checkpoint to resume."""
    return bool(complete_in(checkpoint_root(project))[0])


def continue_numbering(project: Any, source: Path | str) -> None:
    """After loading `source`, the next automatic save follows it (checkpoint_<n+1>)."""
    match = CHECKPOINT_RE.match(_name(source))
    if project.automatic_checkpoint_naming and match:
        project.iteration = int(match.group(1)) + 1


def rotate(root: Path | str, limit: int | None) -> None:
    """Keep the `limit` newest complete checkpoints under `root` (all with None)."""
    if limit is None:
        return
    complete, _ = complete_in(root)
    for old in complete[: max(len(complete) - limit, 0)]:
        if isinstance(old, Path):
            shutil.rmtree(old)
        else:
            remove_from_store(old)


def remove_from_store(url: str) -> None:
    """A checkpoint deleted from a store: its marker first, so that a deletion cut short
    leaves an incomplete prefix, never a complete-looking one missing files."""
    from accel_bigmodel import stores

    stores.remove(stores.join(url, MARKER))
    stores.remove(url)
