"""Familiar path `accelerate.commands.config`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_main
from accel.commands.config.config_args import default_config_file, load_config_from_file

main = cli_main("config")

__all__ = ["default_config_file", "load_config_from_file", "main"]
