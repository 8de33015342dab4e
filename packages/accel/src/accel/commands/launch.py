"""Familiar path `accelerate.commands.launch`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_command, cli_main, cli_parser

launch_command = cli_command("launch_command")
launch_command_parser = cli_parser("launch")
main = cli_main("launch")

__all__ = ["launch_command", "launch_command_parser", "main"]
