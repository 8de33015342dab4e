"""Durable writes: deferred fsyncs finish before the block ends and report their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accel_parallel import deferred_fsync, fsync_file, save_object


def test_deferred_fsync_waits_and_reports_errors(tmp_path: Path) -> None:
    with deferred_fsync():
        save_object({"a": torch.arange(3)}, tmp_path / "a.pt")
        fsync_file(tmp_path / "a.pt")
    assert torch.load(tmp_path / "a.pt", weights_only=True)["a"].tolist() == [0, 1, 2]
    with pytest.raises(FileNotFoundError), deferred_fsync():
        fsync_file(tmp_path / "missing.bin")
    with pytest.raises(FileNotFoundError):  # outside the block: immediate
        fsync_file(tmp_path / "missing.bin")


def test_deferred_fsync_can_be_switched_off(tmp_path: Path) -> None:
    with deferred_fsync(enabled=False):
        fsync_file(tmp_path / "missing.bin")  # skipped, so no error
