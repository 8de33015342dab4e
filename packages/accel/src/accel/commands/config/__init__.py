"""Familiar path `accelerate.commands.config`: re-exports from the packages that own the code."""

from accel._compat._commands import cli_main
from accel.commands.config.config import (
    config_command_parser,
)
from accel.commands.config.config_args import default_config_file, load_config_from_file
from accel.commands.config.default import (
    default_command_parser,
)
from accel.commands.config.update import (
    update_command_parser,
)
from accel_cli.familiar import get_config_parser

main = cli_main("config")


__all__ = ["default_config_file", "load_config_from_file", "main"]


__all__ += [
    "config_command_parser",
    "default_command_parser",
    "update_command_parser",
]

__all__ += [
    "get_config_parser",
]
