"""Familiar path `accelerate.commands.to_fsdp2`: re-exports from the packages that own the code."""

import argparse

from accel._compat._commands import cli_parser
from accel_cli.familiar import (
    ARGUMENT_KEY_MAPPING,
    ARGUMENT_VALUE_MAPPING,
    ConversionStatus,
    CustomArgumentParser,
    convert_config_to_fsdp2,
    load_config,
)

to_fsdp2_command_parser = cli_parser("to-fsdp2")


def to_fsdp2_command(args: argparse.Namespace) -> int:
    """`accel to-fsdp2`, reading the file through this module's `load_config`."""
    from accel_cli.familiar import to_fsdp2_command as run

    return run(args, load_config=lambda path: load_config(path))


__all__ = [
    "ARGUMENT_KEY_MAPPING",
    "ARGUMENT_VALUE_MAPPING",
    "ConversionStatus",
    "CustomArgumentParser",
    "convert_config_to_fsdp2",
    "load_config",
    "to_fsdp2_command",
    "to_fsdp2_command_parser",
]
