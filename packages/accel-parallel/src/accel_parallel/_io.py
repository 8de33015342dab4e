"""Durable writes: fsync of files and folders, and torch.save that is fsynced."""

from __future__ import annotations

import os
from typing import Any

import torch


def fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_object(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save, then fsync."""
    torch.save(obj, path)
    fsync_file(path)
