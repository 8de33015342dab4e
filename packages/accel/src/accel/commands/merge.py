"""Familiar path `accelerate.commands.merge`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    cli_command,
    cli_main,
    cli_parser,
)
from accel_cli.familiar import CustomArgumentParser
from accel_parallel import (
    merge_fsdp_weights,
)

main = cli_main("merge-weights")


merge_command = cli_command("merge_weights_command")


merge_command_parser = cli_parser("merge-weights")


__all__ = ["main", "merge_command", "merge_command_parser"]


__all__ += [
    "merge_fsdp_weights",
]

__all__ += [
    "CustomArgumentParser",
]
