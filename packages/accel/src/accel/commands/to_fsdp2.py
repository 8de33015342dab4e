"""Familiar path `accelerate.commands.to_fsdp2`: re-exports from the packages that own the code."""

from accel._compat._misc import cli_command, cli_parser

to_fsdp2_command = cli_command("to_fsdp2_command")
to_fsdp2_command_parser = cli_parser("to-fsdp2")

__all__ = ["to_fsdp2_command", "to_fsdp2_command_parser"]
