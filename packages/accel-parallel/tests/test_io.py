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


def test_parallel_writes_use_several_threads_and_wait_for_every_file(tmp_path: Path) -> None:
    import threading

    from accel_parallel import deferred_write, parallel_writes

    threads: set[str] = set()
    barrier = threading.Barrier(3, timeout=30)  # three writes must be in flight at once

    def write(obj: dict, path: Path) -> None:
        threads.add(threading.current_thread().name)
        barrier.wait()
        torch.save(obj, path)
        fsync_file(path)

    with deferred_fsync(), parallel_writes(max_workers=3):
        for i in range(3):
            deferred_write(write, {"i": torch.tensor(i)}, tmp_path / f"{i}.pt")
    assert len(threads) == 3 and all(name.startswith("accel-write") for name in threads)
    for i in range(3):  # every file is whole once the block is left
        assert torch.load(tmp_path / f"{i}.pt", weights_only=True)["i"].item() == i


def test_parallel_writes_raise_the_first_error_after_the_others_finish(tmp_path: Path) -> None:
    import time

    from accel_parallel import deferred_write, parallel_writes

    def slow(obj: dict, path: Path) -> None:
        time.sleep(0.2)
        torch.save(obj, path)

    def failing(obj: dict, path: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"), parallel_writes(max_workers=2):
        deferred_write(failing, {}, tmp_path / "bad.pt")
        deferred_write(slow, {"a": torch.ones(2)}, tmp_path / "good.pt")
    assert (tmp_path / "good.pt").exists()  # not abandoned half-way


def test_staged_copies_reuse_the_previous_saves_buffers() -> None:
    from accel_parallel import StagingBuffers, deferred_write, staged_writes

    weight = torch.randn(64, 64)
    state = {"w": weight, "tied": weight, "b": torch.zeros(64)}
    written: list[dict] = []

    def stage(obj: dict, buffers: StagingBuffers, name: str = "model.safetensors") -> dict:
        with staged_writes(buffers) as jobs:
            deferred_write(lambda o, p: written.append(o), obj, Path("/unused") / name)
        for job in jobs:
            job()
        return written[-1]

    buffers = StagingBuffers()
    first = stage(state, buffers)
    assert first["w"] is first["tied"]  # tied tensors stay tied in the copy
    assert first["w"].data_ptr() != weight.data_ptr()  # a copy, not the live tensor
    ptr = first["w"].data_ptr()
    weight.add_(1.0)  # training goes on
    second = stage(state, buffers)  # same file in the next save: same memory, new values
    assert second["w"].data_ptr() == ptr and torch.equal(second["w"], weight)
    assert buffers.nbytes() == (64 * 64 + 64) * 4
    resized = stage({"w": torch.randn(32, 64), "b": torch.zeros(64)}, buffers)
    assert resized["w"].shape == (32, 64)  # another shape: a buffer of its own
    with staged_writes(buffers) as jobs:  # two files of one name in a save never share
        deferred_write(lambda o, p: written.append(o), {"x": weight}, Path("/a/optimizer.bin"))
        deferred_write(lambda o, p: written.append(o), {"x": weight}, Path("/b/optimizer.bin"))
    for job in jobs:
        job()
    assert written[-1]["x"].data_ptr() != written[-2]["x"].data_ptr()
    buffers.clear()
    assert buffers.nbytes() == 0
