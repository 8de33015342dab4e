"""Familiar path `accelerate.commands.test`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_command, cli_main, cli_parser

main = cli_main("test")
test_command = cli_command("test_command")
test_command_parser = cli_parser("test")

__all__ = ["main", "test_command", "test_command_parser"]
