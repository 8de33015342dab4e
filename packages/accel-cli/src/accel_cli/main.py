"""The `accel` command: `accel launch`, `accel config {default,show,validate}`, `accel env`.

Neither this module nor the launch and config commands import torch: the launcher starts in
milliseconds and leaves torch to the workers. `accel env` imports it, since it reports on it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from accel_cli._command import build_command, build_env, physical_cores, with_rendezvous
from accel_cli._config import (
    ConfigError,
    ConfigFile,
    default_file_values,
    find_config_file,
    load_config_file,
    write_config_file,
)
from accel_cli._environment import ENV_ACCEL_CONFIG, ENV_OMP_NUM_THREADS, default_config_path
from accel_cli._parser import _LAUNCH_FLAGS, build_parser, suggest_flag
from accel_cli._resolve import LaunchConfig, Resolution, resolve_launch_config
from accel_cli._run import run_child

_LAUNCH_FIELDS = ("cpu", "mixed_precision", *(name for name, _, _ in _LAUNCH_FLAGS))


def _say(message: str) -> None:
    print(f"accel: {message}", file=sys.stderr)


def _load(config_file: str | None, environ: Mapping[str, str]) -> ConfigFile | None:
    found = find_config_file(config_file, environ)
    return None if found is None else load_config_file(*found)


def _report(file: ConfigFile | None, resolution: Resolution, quiet: bool) -> None:
    if file is not None and not quiet:
        _say(f"using config file {file.path} ({file.origin})")
        if file.noted:
            _say(
                f"note: {file.path} sets {', '.join(file.noted)}, which accel accepts but does "
                f"not act on yet"
            )
    for notice in resolution.notices:
        _say(notice)


def launch_command(args: argparse.Namespace) -> int:
    """`accel launch`: resolve the configuration, then run the script or torchrun."""
    flags = {
        name: getattr(args, name) for name in _LAUNCH_FIELDS if getattr(args, name) is not None
    }
    file = _load(args.config_file, os.environ)
    resolution = resolve_launch_config(flags, file)
    _report(file, resolution, args.quiet)
    config = with_rendezvous(resolution.config)
    if not args.module and not Path(args.script).is_file():
        raise ConfigError(f"The script {args.script!r} does not exist (pass -m to run a module).")
    cmd = build_command(config, args.script, args.script_args, module=args.module)
    cores = physical_cores() if config.cpu and config.nproc_per_node > 1 else None
    env = build_env(config, os.environ, cpu_cores=cores)
    if args.dry_run:
        print(shlex.join(cmd))
        for name in (ENV_OMP_NUM_THREADS, "CUDA_VISIBLE_DEVICES"):
            if env.get(name) != os.environ.get(name):
                print(f"{name}={env[name]}")
        print(f"{ENV_ACCEL_CONFIG}={env[ENV_ACCEL_CONFIG]}")
        return 0
    return run_child(cmd, env)


def config_default_command(args: argparse.Namespace) -> int:
    """`accel config default`: write a config file; keep an existing one unless --force."""
    path = Path(args.config_file) if args.config_file else default_config_path()
    values = default_file_values(
        mixed_precision=args.mixed_precision or "no",
        cpu=bool(args.cpu),
        num_processes=args.num_processes or 1,
    )
    written = write_config_file(path, values, force=args.force)
    _say(f"wrote {written}")
    return 0


def config_show_command(args: argparse.Namespace) -> int:
    """`accel config show`: every resolved value and where it comes from."""
    file = _load(args.config_file, os.environ)
    resolution = resolve_launch_config({}, file)
    if file is None:
        print(f"config file: none (the default location {default_config_path()} has no file)")
    else:
        print(f"config file: {file.path} ({file.origin})")
    for name, value in _fields(resolution.config):
        print(f"{name}: {json.dumps(value)}  [{resolution.sources[name]}]")
    if file is not None and file.noted:
        print(f"accepted but not acted on: {', '.join(file.noted)}")
    return 0


def _fields(config: LaunchConfig) -> list[tuple[str, object]]:
    return [(name, value) for name, value in vars(config).items() if name != "handed_down"] + [
        (key, value) for key, value in config.handed_down.items()
    ]


def config_validate_command(args: argparse.Namespace) -> int:
    """`accel config validate`: load the file and resolve it; any problem is an error."""
    file = _load(args.config_file, os.environ)
    if file is None:
        raise ConfigError(
            f"No config file to validate: pass --config_file, or create {default_config_path()} "
            f"with `accel config default`."
        )
    resolve_launch_config({}, file)
    print(f"{file.path}: ok")
    return 0


def env_command(args: argparse.Namespace) -> int:
    """`accel env`: print the environment for a bug report (imports torch)."""
    from accel_cli._env_report import environment_report

    print(environment_report(os.environ))
    return 0


_COMMANDS = {
    ("launch", None): launch_command,
    ("config", "default"): config_default_command,
    ("config", "show"): config_show_command,
    ("config", "validate"): config_validate_command,
    ("env", None): env_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `accel` command line; return the exit code (the child's, for launch)."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:
            parser.error(
                f"unrecognized arguments: {' '.join(extras)}.{suggest_flag(parser, extras[0])}"
            )
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 2
    command = _COMMANDS[(args.command, getattr(args, "config_command", None))]
    try:
        return command(args)
    except ConfigError as err:
        _say(f"error: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
