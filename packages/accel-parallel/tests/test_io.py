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


def test_fsync_dir_raises_io_errors_and_skips_unsupported(tmp_path, monkeypatch) -> None:
    import errno
    import os

    from accel_parallel import fsync_dir

    def failing(code: int):
        def fsync(fd: int) -> None:
            raise OSError(code, os.strerror(code))

        return fsync

    monkeypatch.setattr(os, "fsync", failing(errno.EINVAL))  # folder fsync not supported
    fsync_dir(tmp_path)
    monkeypatch.setattr(os, "fsync", failing(errno.EIO))
    with pytest.raises(OSError, match=f"flushing folder {tmp_path}"):
        fsync_dir(tmp_path)
    with deferred_fsync(enabled=False):  # ProjectConfiguration(fsync=False)
        fsync_dir(tmp_path)
