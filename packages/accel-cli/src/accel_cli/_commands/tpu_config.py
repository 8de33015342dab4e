"""`accel tpu-config`: run setup commands on every worker of a Cloud TPU VM through `gcloud`.

It composes the `gcloud [alpha] compute tpus tpu-vm ssh NAME --zone ZONE --command "cd
/usr/share; [pip install accel]; COMMANDS" --worker all` command that accelerate 1.15's
`tpu-config` runs, from the flags and the config file (`tpu_name`, `tpu_zone`, `commands`,
`command_file`); --debug prints it and runs nothing. On a pod it is how `accel launch --tpu`
reaches every worker (the pod launcher, xla_dist, left torch-xla in 2.1). Unlike accelerate,
a missing TPU name or zone, a version that is not one, a missing `gcloud` and gcloud's own
failure are errors with an exit code, not a traceback or a success message.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from accel_cli._commands._common import say

NAME = "tpu-config"
_DESCRIPTION = "Run commands across TPU VMs for initial setup before running `accel launch`."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = tpu_command_parser(subparsers)
    parser.set_defaults(subcommand=NAME)  # its --command would hide the subcommand's name
    return parser


def run(args: argparse.Namespace) -> int:
    """Compose (and run, or print under --debug) the gcloud command; 2 when it cannot."""
    try:
        return tpu_command_launcher(args)
    except ValueError as err:
        say(f"error: {err}")
        return 2


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `tpu-config` parser (added to `subparsers` when given)."""
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=_DESCRIPTION)
    else:
        parser = argparse.ArgumentParser("accel tpu-config", description=_DESCRIPTION)
    config = parser.add_argument_group("Config Arguments", "Values a config file can hold.")
    config.add_argument("--config_file", default=None, help="The config file to read.")
    config.add_argument("--tpu_name", default=None, help="The TPU (default: the file's).")
    config.add_argument("--tpu_zone", default=None, help="Its zone (default: the file's).")
    pod = parser.add_argument_group("TPU Arguments", "What runs on the TPU VM.")
    pod.add_argument("--use_alpha", action="store_true", help="Use `gcloud alpha`.")
    pod.add_argument("--command_file", default=None, help="A file of commands, one a line.")
    pod.add_argument("--command", action="append", nargs="+", help="A command to run (repeatable).")
    pod.add_argument("--install_accelerate", action="store_true", help="pip install accel.")
    pod.add_argument(
        "--accelerate_version", default="latest", help="Version to install: latest, dev or X.Y.Z."
    )
    pod.add_argument("--debug", action="store_true", help="Print the command, run nothing.")
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d*)?(\.dev\d+|\.post\d+)?$")
GCLOUD_HINT = "install the Google Cloud CLI: https://cloud.google.com/sdk/docs/install"


def _install_target(version: str) -> str:
    """What `pip install` gets for --accelerate_version (accelerate's three forms)."""
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accel -U"
    if not _VERSION.match(version):
        raise ValueError(
            f"--accelerate_version {version!r} is not a version: pass latest, dev or X.Y.Z."
        )
    return f"accel=={version}"


def tpu_command_launcher(args: argparse.Namespace) -> int:
    """Compose the gcloud command from `args` and the config file; print it under --debug,
    else run it. Returns gcloud's exit code (0 under --debug); ValueError when the command
    cannot be composed."""
    from accel_cli._config_args import load_config_from_file
    from accel_cli._environment import default_config_path

    if args.config_file is not None or default_config_path().is_file():
        defaults = load_config_from_file(args.config_file)
        if not args.command_file and defaults.command_file is not None and not args.command:
            args.command_file = defaults.command_file
        if not args.command and defaults.commands is not None:
            args.command = defaults.commands
        args.tpu_name = args.tpu_name or defaults.tpu_name
        args.tpu_zone = args.tpu_zone or defaults.tpu_zone
    if not args.command_file and not args.command:
        raise ValueError("Pass --command or --command_file (or set commands in the config file).")
    missing = [f"--{n}" for n in ("tpu_name", "tpu_zone") if not getattr(args, n)]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} not given and not in the config file: pass "
            f"{' '.join(f'{m} ...' for m in missing)} (or set them with `accel config`)."
        )
    if args.command_file:
        args.command = [Path(args.command_file).read_text().splitlines()]
    lines = [line for item in args.command for line in (item if isinstance(item, list) else [item])]
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_install_target(args.accelerate_version)}")
    command = "; ".join([*steps, *lines])
    cmd = ["gcloud", *(["alpha"] if args.use_alpha else []), "compute", "tpus", "tpu-vm", "ssh"]
    cmd += [str(args.tpu_name), "--zone", str(args.tpu_zone), "--command", command]
    cmd += ["--worker", "all"]
    if args.debug:
        print(f"Running {' '.join(cmd)}")
        return 0
    if shutil.which("gcloud") is None:
        raise ValueError(f"`gcloud` is not on PATH: {GCLOUD_HINT}, or run with --debug.")
    code = subprocess.run(cmd).returncode
    if code == 0:
        print("Successfully setup pod.")
    else:
        say(f"error: gcloud exited with {code}: the pod's setup did not finish.")
    return code
