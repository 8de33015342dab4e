"""Weights kept on disk: an offload folder with an index, read back through memory maps.

The folder holds ``index.json`` = ``{name: {"dtype", "shape"}}`` and one raw ``.dat`` file per
tensor, ``<name>.dat`` (accelerate's layout); a tied tensor's entry adds "file" and "offset"
to point at the first copy instead of writing it again. An entry may instead point into a safetensors checkpoint (its file and
byte offset), so a checkpoint that is already on disk is used in place and never copied.
Reading maps each file once (copy-on-write, lazily paged) and returns views: no read happens
until the bytes are touched, and the kernel can drop them again under memory pressure.
Indexes written by HuggingFace accelerate (no "file", or "safetensors_file") are read too.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from collections.abc import Iterator, Mapping

import torch

from accel_bigmodel._fault_in import map_private
from accel_bigmodel._header import DTYPES, read_safetensors_header

INDEX_NAME = "index.json"


def dtype_name(dtype: torch.dtype) -> str:
    """ "float32" for torch.float32: the spelling used in offload indexes."""
    return str(dtype).replace("torch.", "")


def _dtype_from_name(name: str) -> torch.dtype:
    value = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"Offload index names an unknown dtype {name!r}.")
    return value


def offload_weight(
    weight: torch.Tensor,
    weight_name: str,
    offload_folder: str | os.PathLike,
    index: dict | None = None,
) -> dict:
    """Write `weight` to ``<offload_folder>/<weight_name>.dat`` and record it in `index`."""
    index = {} if index is None else index
    os.makedirs(offload_folder, exist_ok=True)
    weight = weight.detach().to("cpu").contiguous()
    file_name = f"{weight_name}.dat"
    with open(os.path.join(offload_folder, file_name), "wb") as f:
        nbytes = weight.numel() * weight.element_size()
        if nbytes:
            f.write((ctypes.c_ubyte * nbytes).from_address(weight.data_ptr()))
    # accelerate's entry: the file is implicitly "<weight_name>.dat", read from its start
    index[weight_name] = {"dtype": dtype_name(weight.dtype), "shape": list(weight.shape)}
    return index


def save_offload_index(index: Mapping[str, dict], offload_folder: str | os.PathLike) -> None:
    """Write (merging with what is there) ``index.json`` in `offload_folder`."""
    if not index:
        return
    os.makedirs(offload_folder, exist_ok=True)
    path = os.path.join(offload_folder, INDEX_NAME)
    current = load_offload_index(offload_folder) if os.path.isfile(path) else {}
    current.update(index)
    with open(path, "w") as f:
        json.dump(current, f, indent=1)


def load_offload_index(offload_folder: str | os.PathLike) -> dict:
    """Read ``index.json`` from `offload_folder`."""
    path = os.path.join(offload_folder, INDEX_NAME)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No offload index at {path}. Write one with offload_state_dict() or "
            f"load_checkpoint_in_model(..., offload_folder=...)."
        ) from None


def offload_state_dict(save_dir: str | os.PathLike, state_dict: Mapping[str, torch.Tensor]) -> dict:
    """Write every tensor of `state_dict` to `save_dir` with an index; shared tensors once."""
    index: dict[str, dict] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state_dict.items():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in seen:  # a tied tensor: point at the first one's file
            index[name] = {**index[seen[key]], "file": f"{seen[key]}.dat", "offset": 0}
            continue
        seen[key] = name
        offload_weight(tensor, name, save_dir, index)
    save_offload_index(index, save_dir)
    return index


def safetensors_entries(path: str | os.PathLike) -> dict[str, dict]:
    """Offload-index entries that point at each tensor of a safetensors file in place.

    Tensors of a dtype torch cannot hold are left out. A bad header or a truncated file raises
    a `ValueError` naming the file and the byte (`read_safetensors_header`).
    """
    file = os.path.abspath(path)
    return {
        t.name: {
            "dtype": dtype_name(DTYPES[t.dtype]),
            "shape": list(t.shape),
            "file": file,
            "offset": t.offset,
        }
        for t in read_safetensors_header(path)
        if t.dtype in DTYPES
    }


class MappedFiles:
    """Private (copy-on-write) maps of whole files, made once each, handing out tensor views.

    The maps are `_fault_in.map_private`'s, as for tensors kept in host memory, so a block
    left on disk and a block kept in memory view their pages alike.
    """

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap | None] = {}

    def tensor(self, path: str, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        numel = 1
        for dim in shape:
            numel *= dim
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        if path not in self._maps:
            self._maps[path] = map_private(path)
        data = self._maps[path]
        itemsize = dtype.itemsize
        nbytes = numel * itemsize
        if data is None or offset + nbytes > len(data):
            raise ValueError(f"{path} is truncated: {nbytes} bytes at {offset} are past its end.")
        if offset % itemsize:  # a view needs aligned bytes; copy the rare unaligned one
            raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
            return raw.clone().view(dtype).view(shape)
        return torch.frombuffer(data, dtype=dtype, count=numel, offset=offset).view(shape)

    def clear(self) -> None:
        self._maps.clear()


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """A read-only mapping over tensors in memory (`state_dict`) and in an offload folder.

    Disk tensors are memory-mapped views, created on access; `device` moves them on read.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike | None = None,
        index: Mapping[str, dict] | None = None,
        device: torch.device | str | int | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or both.")
        self.state_dict = dict(state_dict or {})
        self.save_folder = None if save_folder is None else os.fspath(save_folder)
        if index is None and self.save_folder is not None:
            index = load_offload_index(self.save_folder)
        self.index = dict(index or {})
        self.device = device
        self._files = MappedFiles()
        self._keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        # key -> (its index entry, the view made for it): a view of a map holds no memory of
        # its own, and a new entry put in the index for the key is read again
        self._views: dict[str, tuple[dict, torch.Tensor]] = {}

    def location(self, key: str) -> tuple[str, int, torch.dtype, list[int]]:
        """(file, byte offset, dtype, shape) of the disk tensor `key`."""
        entry = self.index[key]
        dtype = _dtype_from_name(entry["dtype"])
        if "safetensors_file" in entry:  # an index written by accelerate or transformers
            # The file keeps its own dtype; the entry's dtype is the one to hand out (see
            # __getitem__), e.g. float32 weights loaded with `dtype=torch.float16`.
            path = entry["safetensors_file"]
            found = safetensors_entries(path)[entry.get("weight_name", key)]
            stored = _dtype_from_name(found["dtype"])
            return path, found["offset"], stored, list(found["shape"])
        path = entry.get("file", f"{key}.dat")
        if not os.path.isabs(path):
            if self.save_folder is None:
                raise ValueError(f"Offload entry {key!r} has a relative file but no save_folder.")
            path = os.path.join(self.save_folder, path)
        return path, int(entry.get("offset", 0)), dtype, list(entry["shape"])

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            tensor = self.state_dict[key]
        else:
            entry = self.index[key]
            known = self._views.get(key)
            if known is not None and known[0] is entry:
                tensor = known[1]
            else:
                path, offset, dtype, shape = self.location(key)
                tensor = self._files.tensor(path, offset, dtype, shape)
                wanted = _dtype_from_name(entry["dtype"])
                if tensor.dtype != wanted:
                    tensor = tensor.to(wanted)  # a copy: made again at each read, not kept
                elif offset % dtype.itemsize == 0:  # a view of the map, not a copy
                    self._views[key] = (entry, tensor)
        return tensor if self.device is None else tensor.to(self.device)

    def map_ahead(self) -> None:
        """Make the views of the disk tensors now (no byte is read): the first forward of a
        model running from the maps on the CPU then only faults their pages in."""
        for key in self.index:
            if key not in self.state_dict:
                self[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self.state_dict or key in self.index


class PrefixedDataset(Mapping[str, torch.Tensor]):
    """The entries of `dataset` under ``prefix``, with the prefix removed from their names."""

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self.dataset if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return f"{self.prefix}{key}" in self.dataset
