"""Familiar path `accelerate.commands.config`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_main

main = cli_main("config")

__all__ = ["main"]
