"""Familiar path `accelerate.commands.env`: re-exports from the packages that own the code."""

import argparse
import os
from shutil import which
from typing import Any

from accel._compat._commands import (
    cli_main,
    cli_parser,
)
from accel._compat._imports import (
    is_mps_available,
)
from accel_cli.familiar import load_config_from_file

env_command_parser = cli_parser("env")


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print and return the environment report (finding `accel` with this module's `which`)."""
    from accel_cli.familiar import env_info

    return env_info(os.environ, getattr(args, "config_file", None), lambda name: which(name))


main = cli_main("env")


__all__ = ["env_command", "env_command_parser", "main", "which"]


__all__ += [
    "is_mps_available",
    "load_config_from_file",
]
