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


def is_url(path: object) -> bool:
    """Whether `path` is an object-store URL (s3://...; file:// is a local path). The store
    module, and with it accel-bigmodel, is imported only for a string that could be one."""
    if not isinstance(path, str) or "://" not in path:
        return False
    from accel_bigmodel.stores import is_url as url

    return url(path)


def as_location(path: str | os.PathLike[str]) -> Path | str:
    """A store URL as given (a str, without a trailing slash), anything else as a local Path
    (a file:// URL loses its scheme)."""
    if is_url(path):
        return path.rstrip("/")
    text = os.fspath(path)
    return Path(text[len("file://") :] if text.lower().startswith("file://") else text)


def save_one(obj: Any, f: Any, safe_serialization: bool) -> None:
    """`Accelerator.save`: `obj` into `f` (a path, a file object, or a store URL: serialized
    in memory, then written as one object), with torch.save or, when asked, safetensors."""
    if isinstance(f, (str, os.PathLike)):
        f = as_location(f)
    if isinstance(f, str):  # a store URL
        if safe_serialization:
            from safetensors.torch import save

            data = save(obj, metadata={"format": "pt"})
        else:
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            data = buffer.getvalue()
        from accel_bigmodel import stores

        stores.write_bytes(f, data)
    elif safe_serialization:
        from safetensors.torch import save_file

        save_file(obj, os.fspath(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)
