"""Checkpoint file I/O: the full weights of a model (accel-bigmodel's weight files, flushed
through accel-parallel's deferred writes) and the other objects of a save_state folder."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from accel_parallel import deferred_write, fsync_file
from accel_parallel.checkpoint import weights_file


def _write_weights(state: dict[str, torch.Tensor], path: Path, safe: bool) -> None:
    from accel_bigmodel import save_weights_file  # imported on use: `import accel` stays light

    save_weights_file(state, path, safe, fsync=False)
    fsync_file(path)  # in the background inside a checkpoint's deferred_fsync


def weights_writer(safe: bool):
    """A `write_full` for strategies: model `base` as ``model.safetensors`` /
    ``pytorch_model_1.bin`` (`accel_parallel.checkpoint.weights_file`)."""

    def write(state: dict[str, torch.Tensor], base: Path) -> None:
        path = base.with_name(weights_file(base.name, safe))
        deferred_write(lambda s, p: _write_weights(s, p, safe), state, path)

    return write


def read_weights(base: Path) -> dict[str, torch.Tensor]:
    """A `read_full` for strategies: model `base`'s safetensors file, else its torch file."""
    from accel_bigmodel import load_weights_file  # imported on use: `import accel` stays light

    for path in (base.with_name(weights_file(base.name, safe)) for safe in (True, False)):
        if path.exists():
            return load_weights_file(path)
    raise FileNotFoundError(
        f"the checkpoint has no weights file {weights_file(base.name)} (nor "
        f"{weights_file(base.name, safe=False)}) in {base.parent}"
    )


def load_file(path: Path, trusted: bool = False) -> Any:
    """torch.load with weights_only; `trusted` files fall back to full unpickling, saying so
    (the warning points at the caller of Accelerator.load_state, which reads them)."""
    if not path.exists():
        raise FileNotFoundError(f"the checkpoint is missing {path.name} (in {path.parent})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        if not trusted:
            raise
        warnings.warn(
            f"{path.name} holds objects beyond tensors and plain values; loading it with full "
            f"unpickling (only load checkpoints you trust).",
            stacklevel=4,
        )
        return torch.load(path, map_location="cpu", weights_only=False)


def save_one(obj: Any, f: Any, safe_serialization: bool) -> None:
    """`Accelerator.save`: `obj` into `f` (a path, a file object, or a store URL: serialized
    in memory, then written as one object), with torch.save or, when asked, safetensors."""
    url = isinstance(f, str) and "://" in f and not f.startswith("file://")
    if isinstance(f, str) and f.startswith("file://"):
        f = f[len("file://") :]
    if safe_serialization:
        from safetensors.torch import save, save_file

        if url:
            _write_url(f, save(obj, metadata={"format": "pt"}))
        else:
            save_file(obj, os.fspath(f), metadata={"format": "pt"})
    elif url:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        _write_url(f, buffer.getvalue())
    else:
        torch.save(obj, f)


def _write_url(url: str, data: bytes) -> None:
    from accel_bigmodel import stores

    stores.write_bytes(url, data)
