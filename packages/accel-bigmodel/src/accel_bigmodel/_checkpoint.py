"""Loading a checkpoint into a (possibly empty) model.

A checkpoint is one ``.safetensors`` / ``.bin`` / ``.pt`` file, a folder holding one, or a
folder with ``model.safetensors.index.json`` / ``pytorch_model.bin.index.json`` =
``{"metadata": {...}, "weight_map": {name: shard_file}}`` and the shards. The chosen reader
(`_sources`) feeds each tensor to a `Placer`, which puts it where the device map says;
tensors mapped to "disk" are not read at all when they sit in a safetensors shard in the right
dtype: the offload index points at them in place, and background threads read them into the
page cache ahead of the forward (`_read_ahead.warm_page_cache`). A checkpoint in an object
store (an fsspec URL: ``s3://bucket/model``) is read with ranged reads (`_store_load`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from accel_bigmodel._device_map import check_device_map
from accel_bigmodel._header import reads_natively
from accel_bigmodel._layout import choose, index_shards
from accel_bigmodel._modeling import retie_parameters
from accel_bigmodel._offload import save_offload_index
from accel_bigmodel._placer import Placer
from accel_bigmodel._progress import Progress
from accel_bigmodel._read_ahead import warm_page_cache
from accel_bigmodel._reader import CheckpointReader, as_reader
from accel_bigmodel._sizes import Device, _as_dtype, available_host_memory, normalize_device
from accel_bigmodel._sources import (
    load_accel,
    load_fastsafetensors,
    load_one_by_one,
    load_runai,
)
from accel_bigmodel._store import is_url, local_path
from accel_bigmodel._store_load import check_store_reader, load_from_store, store_checkpoint_files

logger = logging.getLogger(__name__)


class LoadResult(NamedTuple):
    """What `load_checkpoint_in_model` did not match: model tensors and checkpoint tensors."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _shards_from_index(index_path: str) -> list[str]:
    """The shard files an index names (`_layout.index_shards`), each checked to exist."""
    try:
        with open(index_path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"Cannot read the checkpoint index {index_path}: {e!r}.") from None
    folder = os.path.dirname(index_path)
    shards = [os.path.join(folder, f) for f in index_shards(text, index_path)]
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        raise FileNotFoundError(
            f"The checkpoint index {index_path} lists shard(s) that do not exist: {missing}."
        )
    return shards


def checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """The files making up `checkpoint` (a file, an index json, or a folder), in load order.

    `checkpoint` may be an object-store URL (``s3://bucket/model``): the same rules, and the
    objects' URLs (`_store_load.store_checkpoint_files`)."""
    if is_url(checkpoint):
        return store_checkpoint_files(checkpoint)
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        return _shards_from_index(path) if path.endswith(".json") else [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Checkpoint {path!r} is neither a file nor a folder.")
    index, name = choose(path, os.listdir(path))
    chosen = os.path.join(path, name)
    return _shards_from_index(chosen) if index else [chosen]


def _finish(
    model: nn.Module, checkpoint: str, missing: list[str], unexpected: list[str], strict: bool
) -> LoadResult:
    def listed(keys: list[str]) -> str:
        return f"{keys[:50]}{' ...' if len(keys) > 50 else ''}"

    name = type(model).__name__
    if strict and (missing or unexpected):
        raise ValueError(
            f"Checkpoint {checkpoint} and {name} do not match: missing keys {listed(missing)}, "
            f"unexpected keys {listed(unexpected)}. Pass strict=False to load what matches."
        )
    if unexpected:
        logger.warning(
            f"Some weights of the model checkpoint at {checkpoint} were not used when "
            f"initializing {name}: {listed(unexpected)}. Check that the checkpoint was saved "
            f"from this model definition."
        )
    if missing:
        logger.warning(
            f"Some weights of {name} were not in the checkpoint at {checkpoint} and keep their "
            f"current values: {listed(missing)}."
        )
    return LoadResult(missing, unexpected)


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: Mapping[str, Device] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    strict: bool = False,
    show_progress: bool | None = None,
    reader: str | CheckpointReader = "auto",
) -> LoadResult:
    """Load `checkpoint` into `model`, placing each tensor as `device_map` says.

    `checkpoint` is a file, an index json or a folder, locally or in an object store (an
    fsspec URL such as ``s3://bucket/model``, read with concurrent ranged reads, nothing
    written to local disk but the offload folder; needs the `s3` extra).

    Works on models built under `init_empty_weights`. Tensors mapped to "disk" go to
    `offload_folder` (indexed in its ``index.json``); buffers stay in memory with their stored
    values unless `offload_buffers`. Floating tensors are cast to `dtype` (or to the model's
    dtype), except in `keep_in_fp32_modules`. Tied parameters are tied again after loading.
    Missing / unexpected keys raise with `strict`, else warn. `reader` picks how safetensors
    shards are read: "auto"/"accel" (tensors kept in host memory in their stored dtype map
    their shard, a cold one faulted in by threads in the model's order while the first forward
    runs; the others read concurrently into new tensors within a bounded buffer), "mmap",
    "runai", "fastsafetensors", or a `CheckpointReader` with its knobs. Peak memory stays near the model's size plus the
    reader's buffer; `offload_state_dict` is accepted for compatibility (nothing to save).
    """
    del offload_state_dict
    reader = as_reader(reader)
    if is_url(checkpoint):
        check_store_reader(reader, checkpoint)
    if is_url(offload_folder):
        local_path(offload_folder)  # refuses: an offload folder is local
    dtype = _as_dtype(dtype)
    files = checkpoint_files(checkpoint)
    if device_map is not None:
        device_map = {k: normalize_device(v) for k, v in device_map.items()}
        check_device_map(model, device_map)
        disk = sorted(k for k, v in device_map.items() if v == "disk")
        if disk and offload_folder is None:
            raise ValueError(
                f"The device_map sends {disk[:10]} to 'disk' but no offload_folder was given; "
                f"pass offload_folder='some/folder'."
            )
    placer = Placer(
        model, device_map, offload_folder, dtype, offload_buffers, list(keep_in_fp32_modules or ())
    )
    return load_with_placer(placer, os.fspath(checkpoint), files, reader, show_progress, strict)


def load_with_placer(
    placer: Placer,
    checkpoint: str,
    files: list[str],
    reader: CheckpointReader,
    show_progress: bool | None,
    strict: bool,
) -> LoadResult:
    """Feed every tensor of `files` to `placer` with `reader`; what `load_checkpoint_in_model`
    does once the arguments are checked (a quantized load passes its own Placer)."""
    model, offload_folder = placer.model, placer.offload_folder
    if is_url(checkpoint):
        check_store_reader(reader, checkpoint)
        progress = Progress(len(files), "Loading checkpoint shards", show_progress)
        load_from_store(placer, files, reader, progress)
        _retie_loaded(model, placer.tied)
        if placer.index:
            save_offload_index(placer.index, offload_folder)
        return _finish(model, checkpoint, placer.missing(), placer.unexpected, strict)
    safetensors = [f for f in files if f.endswith(".safetensors")]
    others = [f for f in files if not f.endswith(".safetensors")]
    _check_reader_serves(reader, others)
    progress = Progress(len(files), "Loading checkpoint shards", show_progress)
    if reader.backend in ("auto", "accel") and safetensors:
        others = load_accel(placer, safetensors, reader, progress) + others
    elif reader.backend == "runai" and safetensors:
        load_runai(placer, safetensors, progress)
    elif reader.backend == "fastsafetensors" and safetensors:
        load_fastsafetensors(placer, safetensors, reader, progress)
    else:
        others = files
    for path in others:
        load_one_by_one(placer, path)
        progress.update()
    _retie_loaded(model, placer.tied)
    if placer.index:
        save_offload_index(placer.index, offload_folder)
    if reader.backend != "mmap":
        warm_page_cache(_within_free_memory(placer.warm_ranges()), cached=placer.cached_files)
    return _finish(model, checkpoint, placer.missing(), placer.unexpected, strict)


def _check_reader_serves(reader: CheckpointReader, others: list[str]) -> None:
    if others and reader.backend in ("accel", "runai", "fastsafetensors"):
        raise ValueError(
            f"reader={reader.backend!r} reads safetensors files, but the checkpoint has "
            f"{[os.path.basename(f) for f in others][:5]}. Use reader='auto' (torch.load with "
            f"weights_only=True for .bin/.pt) or convert the checkpoint to safetensors."
        )
    if reader.backend == "accel" and not reads_natively():
        raise ValueError(
            "reader='accel' reads little-endian bytes as they are, and this machine is "
            "big-endian; use reader='auto' or 'mmap'."
        )


def _within_free_memory(ranges: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The leading ranges whose total fits in half the memory free now (a cache hint only)."""
    if not ranges:
        return []
    room, kept = available_host_memory() // 2, []
    for path, offset, nbytes in ranges:
        if nbytes > room:
            break
        room -= nbytes
        kept.append((path, offset, nbytes))
    return kept


def _retie_loaded(model: nn.Module, tied: list[list[str]]) -> None:
    """Tie each group to the member that got data (the checkpoint stores ties once)."""
    from accel_bigmodel._modeling import _get_tensor

    groups = []
    for group in tied:
        real = [n for n in group if _get_tensor(model, n).device.type != "meta"]
        if real:
            groups.append([real[0]] + [n for n in group if n != real[0]])
    retie_parameters(model, groups)
