"""Familiar path `accelerate.commands.config.update`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    cli_command,
    cli_parser,
)
from accel_cli.familiar import SubcommandHelpFormatter, load_config_from_file, update_config

update_command_parser = cli_parser("config", "update")


update_config_command = cli_command("config_update_command")


__all__ = ["update_command_parser", "update_config_command"]


__all__ += [
    "load_config_from_file",
]

__all__ += [
    "SubcommandHelpFormatter",
    "update_config",
]
