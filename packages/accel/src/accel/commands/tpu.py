"""Familiar path `accelerate.commands.tpu`: re-exports from the packages that own the code."""

from accel._compat._left_out import tpu_command_parser
from accel._compat._unsupported import TPU, unsupported
from accel_cli._config import (
    load_config_from_file,
)

main = unsupported("main", *TPU)


__all__ = ["main", "tpu_command_parser"]


__all__ += [
    "load_config_from_file",
]
