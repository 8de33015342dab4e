"""What `accel launch` refuses before anything starts, and the flags it folds into sections.

A refusal names the flag or key, why accel does not provide it, and what to use instead. A
flag or key left at its default is never refused. All refusals of one command line are
reported together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accel_cli._config import ConfigError, ConfigFile
from accel_cli._flags import (
    BY_NAME,
    FLAGS,
    MSAMP,
    REFUSED_DYNAMO_BACKENDS,
    SECTION_KEYS,
    effective,
)
from accel_cli._resolve import LaunchConfig

_E5M2 = (
    "E5M2 for every tensor is not a training recipe TransformerEngine or torchao offers; use "
    "HYBRID (E4M3 forward, E5M2 gradients) or E4M3"
)
_OPT_LEVEL = "it sets MS-AMP's optimizer level, and " + MSAMP


def _value_refusal(name: str, value: Any) -> str | None:
    """Why this value of an honoured flag or section key cannot be honoured (None: it can)."""
    text = str(value).strip()
    if name == "dynamo_backend" and text.lower() in REFUSED_DYNAMO_BACKENDS:
        return REFUSED_DYNAMO_BACKENDS[text.lower()]
    if name == "fp8_backend" and text.lower() == "msamp":
        return MSAMP
    if name == "fp8_format" and text.upper() == "E5M2":
        return _E5M2
    if name == "fp8_opt_level" and text.upper() == "O1":
        return _OPT_LEVEL
    return None


def flag_refusals(
    given: Mapping[str, Any],
    mixed_precision: str = "no",
    fsdp_from_file: bool = False,
    deepspeed_from_file: bool = False,
    megatron_from_file: bool = False,
) -> list[str]:
    """One message per given flag that asks for something accel does not provide."""
    out = []
    for flag in FLAGS:
        value = given.get(flag.name)
        if flag.is_default(value):
            continue
        spelled = flag.option_strings[-1 if flag.option_strings[0] == "-t" else 0]
        shown = "" if flag.type is None else f" {value}"
        if flag.refused:
            out.append(f"{spelled}{shown}: {flag.refused}.")
        elif (why := _value_refusal(flag.name, value)) is not None:
            out.append(f"{spelled}{shown}: {why}.")
        elif flag.name.startswith("fp8_") and mixed_precision != "fp8":
            out.append(
                f"{spelled}{shown}: fp8 settings apply only with --mixed_precision fp8 (the run "
                f"uses {mixed_precision!r}); add --mixed_precision fp8 or drop {spelled}."
            )
    fsdp_flags = [  # set to something other than accelerate's default, without FSDP
        f"--{n}" for n, (section, _) in SECTION_KEYS.items()
        if section == "fsdp_config" and given.get(n) is not None
        and str(given[n]).lower() != str(BY_NAME[n].default).lower()
    ]  # fmt: skip
    if fsdp_flags and not given.get("use_fsdp") and not fsdp_from_file:
        out.append(
            f"{', '.join(fsdp_flags)}: FSDP settings apply only to an FSDP run; add --use_fsdp "
            f"(or distributed_type: FSDP in the config file) or drop them."
        )
    ds_flags = [
        f"--{n}" for n, (section, _) in SECTION_KEYS.items()
        if section == "deepspeed_config" and given.get(n) is not None
    ]  # fmt: skip
    if ds_flags and not given.get("use_deepspeed") and not deepspeed_from_file:
        out.append(
            f"{', '.join(ds_flags)}: DeepSpeed settings apply only to a DeepSpeed run; add "
            f"--use_deepspeed (or distributed_type: DEEPSPEED in the config file) or drop them."
        )
    mt_flags = [  # set away from accelerate's default, without --use_megatron_lm
        f"--{n}" for n, (section, _) in SECTION_KEYS.items()
        if section == "megatron_lm_config" and not BY_NAME[n].is_default(given.get(n))
    ]  # fmt: skip
    if mt_flags and not given.get("use_megatron_lm") and not megatron_from_file:
        out.append(
            f"{', '.join(mt_flags)}: Megatron-LM plugin settings apply only with "
            f"--use_megatron_lm (or distributed_type: MEGATRON_LM in the config file); add it "
            f"or drop them."
        )
    if given.get("use_megatron_lm") and (given.get("use_fsdp") or given.get("use_deepspeed")):
        out.append("--use_megatron_lm and FSDP/DeepSpeed contradict: pick one engine.")
    if given.get("use_deepspeed") and (given.get("use_fsdp") or fsdp_from_file):
        out.append("--use_deepspeed and FSDP contradict: pick one engine.")
    main = given.get("main_training_function")
    if main is not None and main != "main":
        out.append(
            f"--main_training_function {main}: accelerate calls it only to start TPU workers; "
            f"accel runs the script as __main__ (call {main}() under `if __name__ == "
            f"'__main__':`, or use accel.notebook_launcher({main}) in a notebook)."
        )
    return out


def section_refusals(handed_down: Mapping[str, Any]) -> list[str]:
    """Messages for dynamo_config / fp8_config values accel cannot honour."""
    out = []
    for flag_name, (section, key) in SECTION_KEYS.items():
        value = (handed_down.get(section) or {}).get(key)
        if value is None:
            continue
        why = _value_refusal(flag_name, value)
        if why is not None:
            out.append(f"{section}.{key}: {value!r}: {why}.")
    for key, value in (handed_down.get("parallelism_config") or {}).items():
        flag = BY_NAME.get(key)  # its keys are the flags' names
        if flag is not None and flag.refused and not flag.is_default(value):
            out.append(f"parallelism_config.{key}: {value!r}: {flag.refused}.")
    return out


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
                    "megatron_lm_config")  # fmt: skip
    for section in (*sections_out, "parallelism_config"):
        if sections.get(section):
            handed[section] = typed_section(section, sections[section])
    return dataclasses.replace(config, handed_down=handed)


def check_launch(config: LaunchConfig, given: Mapping[str, Any], file: ConfigFile | None) -> None:
    """Raise one ConfigError listing everything this launch asks for that accel refuses."""
    kind = config.handed_down.get("distributed_type")
    problems = flag_refusals(
        given, config.mixed_precision, fsdp_from_file=kind == "FSDP",
        deepspeed_from_file=kind == "DEEPSPEED", megatron_from_file=kind == "MEGATRON_LM",
    )  # fmt: skip
    problems += [] if file is None else list(file.refused)
    if given.get("no_python") and given.get("module"):
        problems.append("--no_python and -m/--module contradict: pick one.")
    if problems:
        lines = "\n  - ".join(dict.fromkeys(problems))
        raise ConfigError(f"accel launch does not provide what this run asks for:\n  - {lines}")


# Section keys whose values the workers receive as int, float or bool (accelerate's plugins
# read them so); flags arrive as strings and files may quote them.
_INTS = {
    "fsdp_version", "fsdp_min_num_params", "zero_stage", "gradient_accumulation_steps",
    "margin", "interval", "amax_history_length",
    *(k for k in SECTION_KEYS if k.startswith("parallelism_config_") and k.endswith("_size")),
    "megatron_lm_tp_degree", "megatron_lm_pp_degree", "megatron_lm_num_micro_batches",
    "megatron_lm_context_parallel_size",
}  # fmt: skip
_FLOATS = {"gradient_clipping", "megatron_lm_gradient_clipping", "megatron_lm_attention_dropout",
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
    from accel_cli._flags import str_to_bool

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
