"""A ZeRO checkpoint saved on another number of processes, loaded through DeepSpeed's
universal checkpoint.

A ZeRO 1-3 engine writes its optimizer state (fp32 master weights, Adam moments) as one flat
partition per data-parallel rank (``zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt``), which
only a run with as many ranks can read back. When the number differs, process 0 converts the
engine's tag folder with DeepSpeed's own `ds_to_universal` into a temporary folder beside the
checkpoint (one file per parameter and state), every process loads it with the engine's
universal-checkpoint loader, and the folder is removed. The user's checkpoint is only read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("accel_parallel.deepspeed")

_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def saved_data_parallel_size(tag_folder: Path) -> int | None:
    """How many data-parallel ranks wrote the ZeRO partitions in `tag_folder` (None when
    it holds none, as for an engine saved without an optimizer)."""
    ranks = {int(m.group(1)) for f in tag_folder.iterdir() if (m := _OPTIM_FILE.match(f.name))}
    return len(ranks) or None


def engine_data_parallel_size(engine: Any) -> int:
    """The number of ZeRO partitions this engine's optimizer state has."""
    return int(getattr(engine, "seq_dp_world_size", None) or engine.dp_world_size)


def needs_universal(engine: Any, tag_folder: Path) -> int | None:
    """The saved data-parallel size when it differs from the engine's (ZeRO 1-3), else None."""
    if not engine.zero_optimization():
        return None
    saved = saved_data_parallel_size(tag_folder)
    return saved if saved is not None and saved != engine_data_parallel_size(engine) else None


def load_universal(engine: Any, directory: Path, tag: str, *, strict: bool) -> None:
    """Load the engine's checkpoint `directory/tag`, saved on another data-parallel size, as a
    universal checkpoint (weights, optimizer state, scheduler and counters)."""
    with _universal_copy(directory, tag) as folder:
        config = engine._config
        before = config.load_universal_checkpoint
        config.load_universal_checkpoint = True
        try:
            path, _ = engine.load_checkpoint(
                os.fspath(folder), tag=tag, load_module_strict=strict,
                load_optimizer_states=True, load_lr_scheduler_states=True,
            )  # fmt: skip
        finally:
            config.load_universal_checkpoint = before
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load the converted checkpoint {directory / tag}.")


@contextlib.contextmanager
def _universal_copy(directory: Path, tag: str) -> Iterator[Path]:
    """A folder holding the universal form of `directory/tag`, made by process 0 and seen
    by every process; removed when every process has loaded it."""
    import torch.distributed as dist

    rank = dist.get_rank()
    answer: list[Any] = [None]
    if rank == 0:
        try:
            answer[0] = ("ok", os.fspath(_convert(directory, tag)))
        except Exception as err:  # every process raises it, not only this one
            answer[0] = ("error", f"{type(err).__name__}: {err}")
    dist.broadcast_object_list(answer, src=0)
    status, value = answer[0]
    if status != "ok":
        raise RuntimeError(
            f"converting the DeepSpeed checkpoint {directory / tag} for another number of "
            f"processes (DeepSpeed's ds_to_universal) failed: {value}"
        )
    folder = Path(value)
    try:
        if not (folder / tag).is_dir():
            raise FileNotFoundError(
                f"process {rank} does not see {folder}, where process 0 converted the "
                f"DeepSpeed checkpoint {directory / tag} for this number of processes: resume "
                f"from a checkpoint folder on storage that every process shares."
            )
        yield folder
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


def _convert(directory: Path, tag: str) -> Path:
    """Run DeepSpeed's converter on `directory/tag` into a new folder; returns the folder,
    which holds `tag/` in the universal layout (and DeepSpeed's ``latest_universal``)."""
    from deepspeed.checkpoint import ds_to_universal

    folder = Path(tempfile.mkdtemp(prefix=f".accel_universal_{directory.name}_", dir=_beside(directory)))  # fmt: skip
    args = argparse.Namespace(
        input_folder=os.fspath(directory / tag), output_folder=os.fspath(folder / tag),
        num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
        inject_missing_state=True,
    )  # fmt: skip
    said = io.StringIO()
    try:  # the converter reports its progress on stdout and stderr
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            ds_to_universal.main(args)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        logger.error("ds_to_universal said:\n%s", said.getvalue())
        raise
    logger.debug("ds_to_universal said:\n%s", said.getvalue())
    return folder


def _beside(directory: Path) -> Path:
    """Where the converted copy goes: the checkpoint's parent folder, or above it when that is
    a ``checkpoints/`` folder (automatic naming's ``checkpoints/checkpoint_<n>``: both
    libraries take every folder there for a checkpoint)."""
    parent = directory.resolve().parent
    if parent.name == "checkpoints":
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        raise PermissionError(
            f"the DeepSpeed checkpoint {directory} was saved on another number of processes; "
            f"its universal copy is written beside it, but {parent} is not writable. Copy the "
            f"checkpoint to a writable folder, or resume on the number of processes that saved it."
        )
    return parent
