"""Familiar path `accelerate.commands.env`: re-exports from the packages that own the code."""

from accel._compat._imports import (
    is_mps_available,
)
from accel._compat._misc import cli_command, cli_main, cli_parser
from accel_cli._config import (
    load_config_from_file,
)

env_command = cli_command("env_command")


env_command_parser = cli_parser("env")


main = cli_main("env")


__all__ = ["env_command", "env_command_parser", "main"]


__all__ += [
    "is_mps_available",
    "load_config_from_file",
]
