"""Familiar path `accelerate.commands.estimate`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_command, cli_main, cli_parser

estimate_command = cli_command("estimate_memory_command")
estimate_command_parser = cli_parser("estimate-memory")
main = cli_main("estimate-memory")

__all__ = ["estimate_command", "estimate_command_parser", "main"]
