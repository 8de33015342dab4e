"""Familiar path `accelerate.commands.utils`: re-exports from the packages that own the code."""

from accel_cli.familiar import CustomArgumentGroup, CustomArgumentParser

__all__ = []

__all__ += [
    "CustomArgumentGroup",
    "CustomArgumentParser",
]
