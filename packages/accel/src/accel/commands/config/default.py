"""Familiar path `accelerate.commands.config.default`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    cli_command,
    cli_parser,
    write_basic_config,
)
from accel_cli.familiar import ClusterConfig, SubcommandHelpFormatter

default_command_parser = cli_parser("config", "default")
default_config_command = cli_command("config_default_command")

__all__ = ["default_command_parser", "default_config_command", "write_basic_config"]

__all__ += [
    "ClusterConfig",
    "SubcommandHelpFormatter",
]
