"""Familiar path `accelerate.commands.accelerate_cli`: re-exports from the packages that own the code."""

from accel._compat._commands import cli_main
from accel.commands.env import (
    env_command_parser,
)
from accel.commands.estimate import (
    estimate_command_parser,
)
from accel.commands.launch import (
    launch_command_parser,
)
from accel.commands.merge import (
    merge_command_parser,
)
from accel.commands.test import (
    test_command_parser,
)
from accel.commands.to_fsdp2 import (
    to_fsdp2_command_parser,
)
from accel_cli.familiar import CustomArgumentParser, get_config_parser, tpu_command_parser

main = cli_main()


__all__ = ["main"]


__all__ += [
    "env_command_parser",
    "estimate_command_parser",
    "launch_command_parser",
    "merge_command_parser",
    "test_command_parser",
    "to_fsdp2_command_parser",
    "tpu_command_parser",
]

__all__ += [
    "CustomArgumentParser",
    "get_config_parser",
]
