"""`accel env`: print the environment for a bug report (imports torch)."""

from __future__ import annotations

import argparse
import os

NAME = "env"
HELP = "Print the environment for a bug report."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return subparsers.add_parser(
        NAME,
        help=HELP,
        description="Print versions, devices, memory and the default config, for a bug report.",
    )


def run(args: argparse.Namespace) -> int:
    """Print the report; torch is imported here, not when the command line is parsed."""
    from accel_cli._env_report import environment_report

    print(environment_report(os.environ))
    return 0
