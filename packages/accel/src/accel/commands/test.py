"""Familiar path `accelerate.commands.test`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    cli_command,
    cli_main,
    cli_parser,
)
from accel_cli.familiar import execute_subprocess_async, path_in_accelerate_package

main = cli_main("test")
test_command = cli_command("test_command")
test_command_parser = cli_parser("test")

__all__ = [
    "execute_subprocess_async",
    "main",
    "path_in_accelerate_package",
    "test_command",
    "test_command_parser",
]
