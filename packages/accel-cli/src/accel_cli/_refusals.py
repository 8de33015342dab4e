"""What `accel launch` refuses before anything starts: flags, and config-file section values.

A refusal names the flag or key, why accel does not provide it, and what to use instead. A
flag or key left at its default is never refused. All refusals of one command line are
reported together (`_resolve.check_launch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_cli._flags import BY_NAME, FLAGS, MSAMP, REFUSED_DYNAMO_BACKENDS, SECTION_KEYS

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
