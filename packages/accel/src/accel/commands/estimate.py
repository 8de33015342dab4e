"""Familiar path `accelerate.commands.estimate`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    cli_command,
    cli_main,
    cli_parser,
)
from accel._compat._imports import (
    is_timm_available,
    is_transformers_available,
)
from accel._compat._utils_other import (
    convert_bytes,
)
from accel_bigmodel import (
    calculate_maximum_sizes,
    init_empty_weights,
)
from accel_cli.familiar import (
    CustomArgumentParser,
    add_timm_hub_prefix,
    check_has_model,
    create_ascii_table,
    create_empty_model,
    estimate_training_usage,
    gather_data,
    verify_on_hub,
)

estimate_command = cli_command("estimate_memory_command")


estimate_command_parser = cli_parser("estimate-memory")


main = cli_main("estimate-memory")


__all__ = ["estimate_command", "estimate_command_parser", "main"]


__all__ += [
    "calculate_maximum_sizes",
    "convert_bytes",
    "init_empty_weights",
    "is_timm_available",
    "is_transformers_available",
]

__all__ += [
    "CustomArgumentParser",
    "add_timm_hub_prefix",
    "check_has_model",
    "create_ascii_table",
    "create_empty_model",
    "estimate_training_usage",
    "gather_data",
    "verify_on_hub",
]
