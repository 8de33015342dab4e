"""The one place accel-precision reads the environment: accelerate's `ACCELERATE_FP8_*` variables.

`accelerate launch --fp8_*` (and accel's familiar `setup_fp8_env`) set them for the workers, and
accelerate's fp8 records read them for every field left as None. accel's records do the same,
so a script launched that way gets the recipe it was launched with; a value given in code wins.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ENV_FP8_PREFIX = "ACCELERATE_FP8_"
# The variables, by the suffix after ENV_FP8_PREFIX (accelerate's names).
ENV_FP8_BACKEND = ENV_FP8_PREFIX + "BACKEND"  # "TE", "AO" ("MSAMP" is refused)
ENV_FP8_OPT_LEVEL = ENV_FP8_PREFIX + "OPT_LEVEL"  # MS-AMP's; only "O2" is accepted
ENV_FP8_USE_AUTOCAST_DURING_EVAL = ENV_FP8_PREFIX + "USE_AUTOCAST_DURING_EVAL"
ENV_FP8_MARGIN = ENV_FP8_PREFIX + "MARGIN"
ENV_FP8_INTERVAL = ENV_FP8_PREFIX + "INTERVAL"
ENV_FP8_FORMAT = ENV_FP8_PREFIX + "FORMAT"
ENV_FP8_AMAX_HISTORY_LEN = ENV_FP8_PREFIX + "AMAX_HISTORY_LEN"
ENV_FP8_AMAX_COMPUTE_ALGO = ENV_FP8_PREFIX + "AMAX_COMPUTE_ALGO"
ENV_FP8_OVERRIDE_FPROP = ENV_FP8_PREFIX + "OVERRIDE_FPROP"
ENV_FP8_OVERRIDE_DGRAD = ENV_FP8_PREFIX + "OVERRIDE_DGRAD"
ENV_FP8_OVERRIDE_WGRAD = ENV_FP8_PREFIX + "OVERRIDE_WGRAD"
ENV_FP8_USE_MXFP8_BLOCK_SCALING = ENV_FP8_PREFIX + "USE_MXFP8_BLOCK_SCALING"
ENV_FP8_PAD_INNER_DIM = ENV_FP8_PREFIX + "PAD_INNER_DIM"
ENV_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER = ENV_FP8_PREFIX + "ENABLE_FSDP_FLOAT8_ALL_GATHER"

_TRUE = ("1", "true", "yes", "y", "t", "on")
_FALSE = ("0", "false", "no", "n", "f", "off")


def as_flag(value: object) -> bool:
    """A boolean from a bool or accelerate's flag strings ("true", "1", "yes", ...)."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def _flag(variable: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"{variable}={raw!r}: expected true or false (or 1 / 0); fix or unset it.")
    return text in _TRUE


def _whole(variable: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{variable}={raw!r}: expected a whole number; fix or unset it.") from None


def fp8_env(variable: str, parse: Callable[[str, str], T] | None = None) -> T | str | None:
    """The value of `variable` (parsed), or None where it is unset or empty."""
    raw = os.environ.get(variable)
    if raw is None or raw == "":
        return None
    return raw if parse is None else parse(variable, raw)


def fp8_env_flag(variable: str) -> bool | None:
    return fp8_env(variable, _flag)


def fp8_env_int(variable: str) -> int | None:
    return fp8_env(variable, _whole)
