"""Familiar path `accelerate.commands.accelerate_cli`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_main

main = cli_main()

__all__ = ["main"]
