"""The Accelerator's opt-in diagnostics: the hang doctor (`hang_timeout`) and the allocator
history written when CUDA runs out of memory (`oom_memory_snapshot`).

Both cost nothing when off: no thread, no hook, nothing per step.
"""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from accel import _accelerator_config as _config_of
from accel._io import is_url
from accel_state import device_entry, resolved_launch_config

if TYPE_CHECKING:
    from accel_state.hang import HangDoctor

OOM_SNAPSHOT_DIR = "memory_snapshot"
_OOM_HISTORY_ENTRIES = 100_000  # allocator events kept (torch's own default)


def _run_folder(project_dir: str | os.PathLike[str] | None) -> Path:
    if not project_dir or is_url(os.fspath(project_dir)):  # a store: reports stay local
        return Path.cwd()
    return Path(project_dir)


def start_hang_doctor(
    hang_timeout: float | None,
    *,
    rank: int,
    world_size: int,
    project_dir: str | os.PathLike[str] | None,
) -> HangDoctor | None:
    """A running HangDoctor when `hang_timeout` (or `accel launch --hang_timeout`) is set."""
    timeout = _config_of.from_launch("hang_timeout", hang_timeout, None)
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(
            f"hang_timeout={timeout!r}: expected seconds > 0 (a step or one collective taking "
            f"longer is diagnosed as a hang), or None to leave the hang doctor off."
        )
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from accel_state.hang import REPORT_DIR_NAME, HangDoctor, process_group_store

    doctor = HangDoctor(
        float(timeout),
        rank=rank,
        world_size=world_size,
        folder=_run_folder(project_dir) / REPORT_DIR_NAME,
        store=process_group_store(),
        notify=resolved_launch_config().get("hang_report_note"),
    )
    # between optimizer steps: every optimizer's step ends a step for the watchdog
    doctor.hooks.append(register_optimizer_step_post_hook(lambda *_: doctor.beat()))
    return doctor.start()


class OOMSnapshot:
    """Record CUDA's allocator history; when an allocation fails, write a snapshot (open it
    at https://pytorch.org/memory_viz) and name the file in the OutOfMemoryError."""

    def __init__(self, device: torch.device, rank: int, project_dir: Any) -> None:
        self.path = _run_folder(project_dir) / OOM_SNAPSHOT_DIR / f"rank{rank}.pickle"
        self.written: Path | None = None
        torch.cuda.memory._record_memory_history(max_entries=_OOM_HISTORY_ENTRIES)
        torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
        self.written = self.path
        print(
            f"accel: CUDA out of memory on device {device} (asked {alloc} bytes, "
            f"{device_free} free); allocator history written to {self.path}",
            file=sys.stderr,
            flush=True,
        )

    def _excepthook(
        self, kind: type[BaseException], error: BaseException, tb: TracebackType | None
    ) -> None:
        if isinstance(error, torch.OutOfMemoryError) and self.written is not None:
            error.add_note(
                f"accel: the allocator history at the failure is in {self.written} (drag it "
                f"onto https://pytorch.org/memory_viz)."
            )
        self._previous_hook(kind, error, tb)


def start_oom_snapshot(
    enabled: bool, *, device: torch.device, rank: int, project_dir: Any
) -> OOMSnapshot | None:
    """An OOMSnapshot on CUDA when `enabled`; elsewhere a warning that there is nothing to
    record."""
    if not enabled:
        return None
    if not device_entry(device).records_memory_history:
        warnings.warn(
            f"oom_memory_snapshot=True on device {device}: only CUDA's allocator keeps a "
            f"history to snapshot, so nothing is recorded on this run.",
            stacklevel=3,
        )
        return None
    return OOMSnapshot(device, rank, project_dir)
