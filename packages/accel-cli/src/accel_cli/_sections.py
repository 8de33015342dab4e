"""The launch flags folded into the config-file sections the workers read (`dynamo_config`,
`fp8_config`, `fsdp_config`, ...), each value typed as accelerate's plugins read it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accel_cli._config import ConfigError
from accel_cli._flags import SECTION_KEYS, effective, str_to_bool
from accel_cli._launch_config import LaunchConfig


def with_flag_sections(config: LaunchConfig, given: Mapping[str, Any]) -> LaunchConfig:
    """Fold the dynamo and fp8 flags into the `dynamo_config` / `fp8_config` sections the
    workers read (a flag beats the file's key). Under fp8, keys neither sets take
    accelerate's launch defaults, so a run means what `accelerate launch` would."""
    sections = {k: dict(v) for k, v in config.handed_down.items() if isinstance(v, Mapping)}
    handed = dict(config.handed_down)
    fp8 = config.mixed_precision == "fp8"
    megatron = given.get("use_megatron_lm") or handed.get("distributed_type") == "MEGATRON_LM"
    for name, (section, key) in SECTION_KEYS.items():
        if section == "fp8_config" and not fp8:
            continue  # fp8 flags at their defaults ask nothing of other precisions
        if section == "megatron_lm_config" and not megatron:
            continue  # the plugin's flags ask nothing without --use_megatron_lm
        value = given.get(name)
        if value is None and section == "fp8_config":
            value = None if key in sections.get(section, {}) else effective(name, given)
        if value is None:
            continue
        if isinstance(value, tuple):
            value = list(value)
        sections.setdefault(section, {})[key] = value
    if given.get("use_fsdp"):
        handed["distributed_type"] = "FSDP"
    if given.get("use_parallelism_config"):  # a mesh even with no size given (DDP replicas)
        sections.setdefault("parallelism_config", {}).setdefault(
            "parallelism_config_dp_replicate_size", 1
        )
    if given.get("use_deepspeed"):
        handed["distributed_type"] = "DEEPSPEED"
    if given.get("use_megatron_lm"):
        handed["distributed_type"] = "MEGATRON_LM"
    sections_out = ("dynamo_config", "fp8_config", "fsdp_config", "deepspeed_config",
                    "megatron_lm_config", "fault_tolerance_config")  # fmt: skip
    for section in (*sections_out, "parallelism_config"):
        if sections.get(section):
            handed[section] = typed_section(section, sections[section])
    return dataclasses.replace(config, handed_down=handed)


# Section keys whose values the workers receive as int, float or bool (accelerate's plugins
# read them so); flags arrive as strings and files may quote them.
_INTS = {
    "fsdp_version", "fsdp_min_num_params", "zero_stage", "gradient_accumulation_steps",
    "margin", "interval", "amax_history_length",
    *(k for k in SECTION_KEYS if k.startswith("parallelism_config_") and k.endswith("_size")),
    "megatron_lm_tp_degree", "megatron_lm_pp_degree", "megatron_lm_num_micro_batches",
    "megatron_lm_context_parallel_size",
    "replica_group_id", "num_replica_groups", "min_replica_groups", "sync_every",
}  # fmt: skip
_FLOATS = {"timeout", "gradient_clipping", "megatron_lm_gradient_clipping", "megatron_lm_attention_dropout",
           "megatron_lm_hidden_dropout"}  # fmt: skip
_BOOLS = {
    "fsdp_offload_params", "fsdp_forward_prefetch", "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload",
    "zero3_init_flag", "zero3_save_16bit_model", "dynamo_use_fullgraph", "dynamo_use_dynamic",
    "dynamo_use_regional_compilation", "use_autocast_during_eval",
    "enable_fsdp_float8_all_gather", "pad_inner_dim",
}  # fmt: skip


def _typed(section: str, key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        if key in _INTS:
            return int(value)
        if key in _FLOATS:
            return float(value)
        if key in _BOOLS:
            return str_to_bool(value)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{section}.{key}: {value!r} is not a valid value ({err}).") from None
    if key == "fsdp_reshard_after_forward" and value.strip().lower() in ("true", "false"):
        return str_to_bool(value)  # FSDP1 strategy names stay strings
    return value


def typed_section(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with each key's string converted to the type accelerate's plugins give it
    (`--fsdp_version 2` reaches the worker as the int 2, `--fsdp_offload_params true` as
    True)."""
    return {key: _typed(section, key, value) for key, value in values.items()}
