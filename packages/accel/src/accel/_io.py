"""Model weights to and from files: safetensors (tied tensors stored once) or torch's format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from accel_parallel import deferred_write, fsync_file

_ALIASES_KEY = "accel_aliases"


def dedupe_shared(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that alias an earlier one (tied weights); return {dropped: kept}."""
    kept: dict[tuple, str] = {}
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            out[name] = tensor
            continue
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.dtype,
        )
        if key in kept:
            aliases[name] = kept[key]
        else:
            kept[key] = name
            out[name] = tensor
    return out, aliases


def save_state_dict(
    state: dict[str, torch.Tensor], path: str | os.PathLike[str], safe: bool = True
) -> None:
    """Write a tensor state dict and fsync it. Tied tensors are written once."""
    if safe:
        unique, aliases = dedupe_shared(state)
        from safetensors.torch import save_file

        tensors = {k: v.detach().contiguous().cpu() for k, v in unique.items()}
        save_file(
            tensors, os.fspath(path), metadata={"format": "pt", _ALIASES_KEY: json.dumps(aliases)}
        )
    else:  # a plain state dict, as accelerate writes it: torch keeps tied tensors shared
        torch.save({k: v.detach().cpu() for k, v in state.items()}, path)
    fsync_file(path)


def load_state_dict(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Read what `save_state_dict` wrote (aliases restored); .bin/.pt load with weights_only."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint file {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(os.fspath(path), framework="pt", device=str(device)) as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            aliases = json.loads((f.metadata() or {}).get(_ALIASES_KEY, "{}"))
    else:
        loaded = torch.load(path, map_location=device, weights_only=True)
        if isinstance(loaded, dict) and set(loaded) == {"state", "aliases"}:
            state, aliases = loaded["state"], loaded["aliases"]
        else:
            state, aliases = loaded, {}
    for dropped, kept in aliases.items():
        state[dropped] = state[kept]
    return state


def _bin_name(base: Path) -> Path:
    """accelerate's torch-format name of a model's weights: model_1 -> pytorch_model_1.bin."""
    return base.with_name(f"pytorch_{base.name}.bin")


def weights_writer(safe: bool):
    """A `write_full` for strategies: ``<base>.safetensors``, or ``pytorch_<base>.bin`` (the
    names accelerate gives them: model.safetensors, pytorch_model.bin)."""

    def write(state: dict[str, torch.Tensor], base: Path) -> None:
        path = base.with_name(base.name + ".safetensors") if safe else _bin_name(base)
        deferred_write(lambda s, p: save_state_dict(s, p, safe), state, path)

    return write


def read_weights(base: Path) -> dict[str, torch.Tensor]:
    """A `read_full` for strategies: ``<base>.safetensors``, else ``pytorch_<base>.bin``."""
    for path in (base.with_name(base.name + ".safetensors"), _bin_name(base)):
        if path.exists():
            return load_state_dict(path)
    raise FileNotFoundError(
        f"the checkpoint has no weights file {base.name}.safetensors (nor "
        f"{_bin_name(base).name}) in {base.parent}"
    )
