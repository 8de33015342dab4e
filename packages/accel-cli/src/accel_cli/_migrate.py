"""Rewrite config files: `accel config update` (old keys to today's) and `accel to-fsdp2`.

Both work on the raw mapping, check the result like any config file before writing it, and
write atomically, so a file that cannot be converted is left as it was.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_cli._config import (
    ConfigError,
    ConfigFile,
    ConfigFileExists,
    config_from_data,
    default_file_values,
    write_config_file,
)

# accelerate's old numeric sharding strategies (1-based, as its questionnaire once wrote).
_SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
)
# FSDP1 key -> FSDP2 key. Keys FSDP2 has no use for map to None; keys not listed are kept.
FSDP2_KEYS: dict[str, str | None] = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
    "fsdp_backward_prefetch": None,  # FSDP2 always prefetches before backward
    "fsdp_forward_prefetch": None,  # not available with FSDP2
    "fsdp_sync_module_states": None,  # implied by fsdp_cpu_ram_efficient_loading
    "fsdp_use_orig_params": None,  # FSDP2 always keeps the original parameters
}
# An FSDP1 sharding strategy -> whether FSDP2 frees the gathered parameters after forward.
RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}


def _yaml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def _strategy_name(value: Any) -> Any:
    """A strategy name from accelerate's old 1-based numbers; other values unchanged."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 5:
        return _SHARDING_STRATEGIES[value - 1]
    return value


def convert_to_fsdp2(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The file's content with its `fsdp_config` in FSDP2 terms, and notes on what changed."""
    out = dict(data)
    fsdp = data.get("fsdp_config") or {}
    if not fsdp:
        return out, ["no fsdp_config in the file: nothing to convert"]
    if fsdp.get("fsdp_version", 1) == 2:
        return out, ["fsdp_version is already 2: nothing to convert"]
    new: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in fsdp.items():
        if key not in FSDP2_KEYS:
            new[key] = value
            continue
        target = FSDP2_KEYS[key]
        if target is None:
            notes.append(f"dropped {key}: FSDP2 has no such setting")
            continue
        if key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
            name = _strategy_name(value)
            value = RESHARD_AFTER_FORWARD.get(name, value)
            if name in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
                notes.append(
                    f"{key}: {name} becomes fsdp_reshard_after_forward: {_yaml(value)}; FSDP2 gets "
                    f"hybrid sharding from parallelism_config (parallelism_config_"
                    f"dp_replicate_size), so set that too"
                )
            elif name == "NO_SHARD":
                notes.append(f"{key}: NO_SHARD shards nothing; plain DDP does the same job")
            elif key != target:
                notes.append(f"{key}: {fsdp[key]} becomes {target}: {_yaml(value)}")
        new[target] = value
    new["fsdp_version"] = 2
    out["fsdp_config"] = new
    return out, notes


class ConversionStatus(enum.Enum):
    """What happens to an FSDP1 key that FSDP2 does not carry over."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


# accelerate's table of the conversion: FSDP1 key -> FSDP2 key or why it is dropped.
ARGUMENT_KEY_MAPPING: dict[str, Any] = {
    key: target if target is not None
    else ConversionStatus.NOT_YET_IMPLEMENTED if key == "fsdp_forward_prefetch"
    else ConversionStatus.REMOVED
    for key, target in FSDP2_KEYS.items()
}  # fmt: skip
ARGUMENT_VALUE_MAPPING = {
    "fsdp_sharding_strategy": dict(RESHARD_AFTER_FORWARD),
    "fsdp_reshard_after_forward": dict(RESHARD_AFTER_FORWARD),
}


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (a config file's mapping) with its fsdp_config converted to FSDP2, updated in
    place and returned; a config already on FSDP2 or without FSDP is returned as it is."""
    import logging

    logger = logging.getLogger("accel.commands.to_fsdp2")
    fsdp = config.get("fsdp_config") or {}
    if fsdp and fsdp.get("fsdp_version", 1) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        return config
    converted, notes = convert_to_fsdp2(config)
    for note in notes:
        logger.warning(note)
    config.update(converted)
    return config


def load_config(config_file: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a YAML config file; an empty file is a ValueError."""
    from accel_cli._config import read_config_data

    data = read_config_data(config_file)
    if not data:
        raise ConfigError(f"Config file {str(config_file)!r} is empty: nothing to convert.")
    return data


def update_config(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The file's content in today's keys, and one line per change."""
    out = dict(data)
    changes: list[str] = []
    if "fp16" in out:
        fp16 = out.pop("fp16")
        if "mixed_precision" not in out:
            out["mixed_precision"] = "fp16" if fp16 else "no"
            changes.append(f"fp16: {_yaml(fp16)} -> mixed_precision: {out['mixed_precision']}")
        else:
            changes.append("removed fp16 (mixed_precision is set)")
    if "dynamo_backend" in out:
        backend = out.pop("dynamo_backend")
        if str(backend).upper() != "NO":
            out.setdefault("dynamo_config", {})
            out["dynamo_config"] = {"dynamo_backend": backend, **(out["dynamo_config"] or {})}
            changes.append(f"dynamo_backend: {backend} -> dynamo_config.dynamo_backend")
        else:
            changes.append("removed dynamo_backend: NO")
    fsdp = out.get("fsdp_config")
    if isinstance(fsdp, dict):
        out["fsdp_config"] = fsdp = dict(fsdp)
        if "fsdp_backward_prefetch_policy" in fsdp:
            fsdp["fsdp_backward_prefetch"] = fsdp.pop("fsdp_backward_prefetch_policy")
            changes.append("fsdp_backward_prefetch_policy -> fsdp_backward_prefetch")
        old = fsdp.get("fsdp_sharding_strategy")
        if _strategy_name(old) != old:
            fsdp["fsdp_sharding_strategy"] = _strategy_name(old)
            changes.append(f"fsdp_sharding_strategy: {old} -> {_strategy_name(old)}")
    for key in [k for k, v in out.items() if v is None or v == {}]:
        del out[key]
        changes.append(f"removed empty {key}")
    if out.get("distributed_type") is False:  # YAML 1.1 reads a bare NO as false
        out["distributed_type"] = "NO"
    if "distributed_type" not in out:
        procs = out.get("num_processes", 1)
        cpu = bool(out.get("use_cpu", False))
        out["distributed_type"] = "NO" if procs == 1 else "MULTI_CPU" if cpu else "MULTI_GPU"
        changes.append(f"added distributed_type: {out['distributed_type']}")
    defaults = default_file_values(cpu=bool(out.get("use_cpu", False)))
    if out["distributed_type"] != "NO":
        del defaults["num_processes"]  # left out means: decided at launch
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
            changes.append(f"added {key}: {_yaml(value)}")
    return out, changes


def rewrite(path: Path, data: Mapping[str, Any], output: Path) -> ConfigFile:
    """Check `data` as a config file named `path`, then write it to `output` atomically."""
    checked = config_from_data(data, path)
    write_config_file(output, data, force=True)
    return checked


def output_path(config_file: str, output_file: str | None, overwrite: bool) -> Path:
    """Where `accel to-fsdp2` writes; refuses to replace a file without --overwrite."""
    if output_file is None:
        if not overwrite:
            raise ConfigError(
                "Pass --output_file PATH for the converted file, or --overwrite to replace "
                f"{config_file!r}."
            )
        return Path(config_file).expanduser()
    out = Path(output_file).expanduser()
    if out.exists() and not overwrite:
        raise ConfigFileExists(f"{output_file!r} already exists; pass --overwrite to replace it.")
    if not os.path.isdir(out.parent or "."):
        raise ConfigError(f"The folder of --output_file {output_file!r} does not exist.")
    return out
