"""What several commands share: messages on stderr, the config file in effect, and flags
that take both spellings (`--num_processes` and `--num-processes`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from accel_cli._config import ConfigFile, find_config_file, load_config_file
from accel_cli._resolve import Resolution


def say(message: str) -> None:
    """One `accel: ...` line on stderr."""
    print(f"accel: {message}", file=sys.stderr)


def load(config_file: str | None, environ: Mapping[str, str]) -> ConfigFile | None:
    """The config file in effect (`--config_file`, else the default one), validated; None
    when there is none."""
    found = find_config_file(config_file, environ)
    return None if found is None else load_config_file(*found)


def report(file: ConfigFile | None, resolution: Resolution, quiet: bool) -> None:
    """Say which file was read and which values the environment gave (unless `quiet`), and
    every notice of the resolution."""
    line = resolution.environment_line()
    if line is not None and not quiet:
        say(line)
    if file is not None and not quiet:
        say(f"using config file {file.path} ({file.origin})")
        if file.noted:
            say(
                f"note: {file.path} sets {', '.join(file.noted)}, which neither accel nor "
                f"accelerate acts on at launch"
            )
    for notice in resolution.notices:
        say(notice)


def add_flag(parser: argparse.ArgumentParser, name: str, **kwargs: object) -> None:
    """`--name` (and `--na-me` for a name with underscores), defaulting to None so that a
    flag left out can be told from one given."""
    spellings = [f"--{name}"]
    if "_" in name:
        spellings.append(f"--{name.replace('_', '-')}")
    parser.add_argument(*spellings, dest=name, default=None, **kwargs)
