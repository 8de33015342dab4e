"""The `accel` subcommands: one module each, listed once in `COMMANDS`.

A command module has `NAME` (the word on the command line), `register(subparsers)`, which
adds its parser, and `run(args) -> int`, which runs it and returns the exit code. Adding a
command is a new module here and one entry in `COMMANDS`; `accel --help` lists them in this
order. Parsing imports no command's engine: each `run` imports what only it needs (torch
among them) when it runs.
"""

from __future__ import annotations

import argparse
import types

from accel_cli._commands import (
    config,
    env,
    estimate_memory,
    launch,
    lighthouse,
    merge_weights,
    test,
    to_fsdp2,
    tpu_config,
)

COMMANDS = (
    launch,
    config,
    env,
    estimate_memory,
    test,
    to_fsdp2,
    merge_weights,
    tpu_config,
    lighthouse,
)
BY_NAME = {command.NAME: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The `accel` parser with every command of `COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="accel",
        allow_abbrev=False,
        description="accel: launch, configure and inspect PyTorch training runs.",
    )
    sub = parser.add_subparsers(
        dest="command",
        metavar="{" + ",".join(command.NAME for command in COMMANDS) + "}",
        required=True,
    )
    for command in COMMANDS:
        command.register(sub)
    return parser


def command_of(args: argparse.Namespace) -> types.ModuleType:
    """The command module that parsed `args` (tpu-config's own --command flag takes the
    `command` attribute, so that one records its name as `subcommand`)."""
    return BY_NAME[getattr(args, "subcommand", None) or args.command]
