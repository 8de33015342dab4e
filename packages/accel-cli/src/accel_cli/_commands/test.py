"""`accel test`: launch the built-in check with the configuration, report each part."""

from __future__ import annotations

import argparse
import os

from accel_cli._commands._common import add_flag, load, report
from accel_cli._resolve import check_launch, resolve_launch_config

NAME = "test"
HELP = "Check that the configured setup works."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    text = (
        "Check the configured setup end to end: launch the processes with the config file, "
        "run collectives, train a few steps and compare with one process, save and load a "
        "checkpoint. Reports pass or fail for each part."
    )
    p = subparsers.add_parser(NAME, help=HELP, description=text)
    add_flag(p, "config_file", metavar="PATH", help="The file to test (default: the default one).")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="Stop the check after this long (default 300).",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Resolve and check the configuration as `accel launch` does, then run the check."""
    from accel_cli._selftest import run_selftest

    file = load(args.config_file, os.environ)
    resolution = resolve_launch_config({}, file)
    check_launch(resolution.config, {}, file)
    report(file, resolution, quiet=False)
    config = resolution.config
    where = "CPU" if config.cpu else "accelerators"
    print(
        f"accel test: {config.num_processes} process(es) on {config.num_machines} machine(s), "
        f"{where}, mixed precision {config.mixed_precision}"
    )
    return run_selftest(config, args.timeout, print)
