"""accelerate.commands.*' functions (and accelerate.launchers.test_launch), through accel-cli:
each runs an `accel` subcommand, builds its parser, or writes the default config file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch


def test_launch() -> int:
    """Run the self-test `accel test` runs."""
    from accel_cli.main import main

    return main(["test"])


def cli_command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs the `accel` subcommand `name` on parsed arguments."""

    def run(args: argparse.Namespace) -> int:
        from accel_cli import familiar

        return getattr(familiar, name)(args)

    run.__name__ = name
    return run


def cli_parser(*path: str) -> Callable[..., argparse.ArgumentParser]:
    """A function returning the argument parser of the `accel` subcommand at `path`
    (the whole `accel` parser for an empty path)."""

    def parser(subparsers: Any = None) -> argparse.ArgumentParser:
        from accel_cli.familiar import build_parser

        found = build_parser()
        for step in path:
            sub = next(a for a in found._actions if isinstance(a, argparse._SubParsersAction))
            found = sub.choices[step]
        return found

    return parser


def cli_main(*words: str) -> Callable[..., int]:
    """`accel <words...>` as a function taking the remaining command-line words."""

    def main(argv: list[str] | None = None) -> int:
        import sys

        from accel_cli.main import main as cli

        rest = list(sys.argv[1:] if argv is None else argv)
        return cli([*words, *rest])

    return main


def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> Any:
    """Write a default config file (for this machine: CPU, or its GPUs); an existing file is
    kept and False returned."""
    from pathlib import Path

    from accel_cli import default_config_path, default_file_values, write_config_file

    path = Path(save_location) if save_location else default_config_path()
    if path.exists():
        return False
    gpus = torch.cuda.device_count()
    values = default_file_values(
        mixed_precision=mixed_precision, cpu=gpus == 0, num_processes=max(gpus, 1)
    )
    return write_config_file(path, values)
