"""`accel to-fsdp2`: convert the FSDP1 settings of a config file to FSDP2."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from accel_cli._commands._common import add_flag, say
from accel_cli._config import ConfigFileNotFound

NAME = "to-fsdp2"
HELP = "Convert an FSDP1 config file to FSDP2."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    text = (
        "Convert a config file's FSDP1 settings to FSDP2: fsdp_sharding_strategy becomes "
        "fsdp_reshard_after_forward, fsdp_version becomes 2, and the keys FSDP2 does not have "
        "(fsdp_backward_prefetch, fsdp_forward_prefetch, fsdp_sync_module_states, "
        "fsdp_use_orig_params) are dropped."
    )
    p = subparsers.add_parser(NAME, help=HELP, description=text)
    add_flag(p, "config_file", metavar="PATH", required=True, help="The file to convert.")
    add_flag(p, "output_file", metavar="PATH", help="Where to write the converted file.")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace --config_file (or an existing --output_file) with the converted file.",
    )
    return p


def run(args: argparse.Namespace, load_config: Callable | None = None) -> int:
    """Convert and write the file (`load_config` reads the file's mapping; default
    `_migrate.load_config`)."""
    from accel_cli import _migrate

    source = Path(args.config_file).expanduser()
    if not source.exists():
        raise ConfigFileNotFound(f"--config_file {args.config_file!r} does not exist.")
    target = _migrate.output_path(args.config_file, args.output_file, args.overwrite)
    data = (load_config or _migrate.load_config)(str(source))
    if (data.get("fsdp_config") or {}).get("fsdp_version", 1) == 2:
        import logging

        logging.getLogger("accel.commands.to_fsdp2").warning(
            "Config already specifies FSDP2, skipping conversion..."
        )
    values, notes = _migrate.convert_to_fsdp2(data)
    _migrate.rewrite(source, values, target)
    for note in notes:
        say(note)
    say(f"wrote {target}")
    return 0
