"""The `accel` command: launch, config (questionnaire, default, show, validate, update),
env, estimate-memory, test, to-fsdp2, merge-weights, tpu-config.

Each subcommand is a module of `accel_cli._commands` (listed in its `COMMANDS`). Neither this
module nor the launch and config commands import torch: the launcher starts in milliseconds
and leaves torch to the workers. `accel env` and `accel test` import it, and
`accel estimate-memory` only for MODULE:FACTORY.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

from accel_cli._commands import build_parser, command_of
from accel_cli._commands._common import say
from accel_cli._config import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `accel` command line; return the exit code (the child's, for launch)."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        args.nondefault = {k for k, v in vars(args).items() if v is not None}
        if extras:
            parser.error(
                f"unrecognized arguments: {' '.join(extras)}.{suggest_flag(parser, extras[0])}"
            )
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 2
    try:
        return command_of(args).run(args)
    except ConfigError as err:
        say(f"error: {err}")
        return 2


def suggest_flag(parser: argparse.ArgumentParser, unknown: str) -> str:
    """' Did you mean --x?' for an unknown flag, or '' when nothing is close."""
    flag = unknown.split("=", 1)[0]
    known = sorted(_option_strings(parser))
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
    return f" Did you mean {close[0]}?" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _option_strings(child)
    return found


if __name__ == "__main__":
    sys.exit(main())
