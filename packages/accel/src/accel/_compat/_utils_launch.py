"""The small environment builders of accelerate.utils.launch: each returns the variables
that the worker processes read (fp8 recipe, parallelism degrees, search paths)."""

from __future__ import annotations

import argparse
import os

# The prefixes of the variables accel-precision and accel-parallel read in the workers.
FP8_PREFIX = "ACCELERATE_"
PARALLELISM_PREFIX = "PARALLELISM_CONFIG_"


def env_var_path_add(env_var_name: str, path_to_add: str | os.PathLike[str]) -> str:
    """The value of the `:`-separated path variable `env_var_name` with `path_to_add` appended
    (empty entries dropped). The caller sets it; `os.environ` is not changed."""
    paths = [p for p in os.environ.get(env_var_name, "").split(":") if p]
    paths.append(str(path_to_add))
    return ":".join(paths)


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """`current_env` with an `ACCELERATE_FP8_*` variable for each `fp8_*` launch argument that
    is set; `fp8_override_linear_precision` (three flags) becomes the FPROP/DGRAD/WGRAD ones."""
    for name, value in vars(args).items():
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            for part, flag in zip(("FPROP", "DGRAD", "WGRAD"), value, strict=True):
                current_env[f"{FP8_PREFIX}FP8_OVERRIDE_{part}"] = str(flag)
        else:
            current_env[f"{FP8_PREFIX}{name.upper()}"] = str(value)
    return current_env


def prepare_extend_env_parallelism_config(
    args: argparse.Namespace, current_env: dict[str, str]
) -> dict[str, str]:
    """`current_env` with the `PARALLELISM_CONFIG_*` variables for the launch arguments'
    parallelism degrees (data replicate/shard, tensor, context, sequence) and backends."""
    p = PARALLELISM_PREFIX
    current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    for field in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend",
                  "sp_size", "sp_backend"):  # fmt: skip
        current_env[p + field.upper()] = str(getattr(args, f"parallelism_config_{field}"))
    if args.parallelism_config_cp_size > 1:
        current_env[p + "CP_COMM_STRATEGY"] = str(args.parallelism_config_cp_comm_strategy)
    if args.parallelism_config_sp_size > 1:
        for field in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"):
            current_env[p + field.upper()] = str(getattr(args, f"parallelism_config_{field}"))
    return current_env
