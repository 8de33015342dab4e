"""Familiar path `accelerate.commands.tpu`: re-exports from the packages that own the code."""

from accel._compat._left_out import tpu_command_parser
from accel._compat._unsupported import TPU, unsupported

main = unsupported("main", *TPU)

__all__ = ["main", "tpu_command_parser"]
