"""`accel config`: the questionnaire (no subcommand), and `default`, `show`, `validate`,
`update` on a config file."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

from accel_cli import _schema
from accel_cli._commands._common import add_flag, load, say
from accel_cli._commands._launch_args import (
    LAUNCH_FIELDS,
    LAUNCH_FLAGS,
    METAVARS,
    environment_values,
    launch_values,
)
from accel_cli._config import (
    ConfigError,
    ConfigFile,
    config_from_data,
    default_file_values,
    find_config_file,
    read_config_data,
    write_config_file,
)
from accel_cli._environment import ENV_OMP_NUM_THREADS, default_config_path
from accel_cli._resolve import Resolution, resolve_launch_config

NAME = "config"
HELP = "Answer a few questions to write a config file, or write, show, check, update one."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help=HELP,
        description="With no subcommand: ask about the machines, processes, precision and engine, "
        "and write the answers as a config file (accelerate's keys). Answers may be piped on "
        "stdin, one per line; an empty line takes the default.",
    )
    p.add_argument(
        "--config_file",
        "--config-file",
        dest="questionnaire_file",
        metavar="PATH",
        default=None,
        help="Where the questionnaire writes (default: the default config path).",
    )
    p.add_argument(
        "--force", dest="questionnaire_force", action="store_true", help="Overwrite without asking."
    )
    csub = p.add_subparsers(
        dest="config_command", metavar="{default,show,validate,update}", required=False
    )
    d = csub.add_parser(
        "default",
        help="Write a config file with default values.",
        description="Write a config file (accelerate's keys, so accelerate reads it too). An "
        "existing file is kept unless --force is given.",
    )
    add_flag(
        d, "config_file", metavar="PATH", help="Where to write (default: the default config path)."
    )
    add_flag(
        d, "mixed_precision", choices=_schema.PRECISIONS, help="Mixed precision mode (default no)."
    )
    add_flag(d, "cpu", action="store_true", help="Run on the CPU.")
    add_flag(d, "num_processes", type=int, metavar="N", help="Processes to launch (default 1).")
    d.add_argument("--force", action="store_true", help="Overwrite an existing file.")
    show_text = (
        "Print the resolved launch configuration and where each value comes from (flag, file, "
        "environment, default). Takes the launch flags, to show what they would change."
    )
    s = csub.add_parser("show", help=show_text, description=show_text)
    add_flag(s, "config_file", metavar="PATH", help="The file to read (default: the default one).")
    add_flag(s, "cpu", action="store_true", help="As `accel launch --cpu`.")
    add_flag(s, "mixed_precision", choices=_schema.PRECISIONS, help="As `accel launch`.")
    for name, kind, _text in LAUNCH_FLAGS:
        add_flag(s, name, type=kind, metavar=METAVARS.get(name, "N"), help="As `accel launch`.")
    s.add_argument("--json", action="store_true", help="Print one JSON object instead.")
    for name, text in (
        ("validate", "Check a config file and report the first problem."),
        (
            "update",
            "Rewrite a config file written by an older accel or accelerate with today's keys "
            "(fp16 -> mixed_precision, dynamo_backend -> dynamo_config, missing keys filled in).",
        ),
    ):
        c = csub.add_parser(name, help=text, description=text)
        add_flag(
            c,
            "config_file",
            metavar="PATH",
            help="The file to read (default: the default config file).",
        )
    return p


def run(args: argparse.Namespace) -> int:
    """The questionnaire, or the subcommand `args.config_command` names."""
    subcommand = getattr(args, "config_command", None)
    if subcommand is None:
        return questionnaire(args)
    subcommands = {"default": default, "show": show, "validate": validate, "update": update}
    return subcommands[subcommand](args)


def questionnaire(args: argparse.Namespace) -> int:
    """`accel config`: ask, then write the answers as a config file."""
    from accel_cli._questionnaire import Asker, run_questionnaire

    path = Path(args.questionnaire_file) if args.questionnaire_file else default_config_path()
    asker = Asker()
    if (
        path.exists()
        and not args.questionnaire_force
        and not asker.yes(f"{path} exists. Replace it?")
    ):
        say(f"kept {path}")
        return 1
    values = run_questionnaire(asker)
    config_from_data(values, path)  # written files always validate
    written = write_config_file(path, values, force=True)
    say(f"wrote {written}; check it with `accel config show --config_file {written}`")
    return 0


def default(args: argparse.Namespace) -> int:
    """`accel config default`: write a config file; keep an existing one unless --force."""
    path = Path(args.config_file) if args.config_file else default_config_path()
    values = default_file_values(
        mixed_precision=args.mixed_precision or "no",
        cpu=bool(args.cpu),
        num_processes=args.num_processes or 1,
    )
    written = write_config_file(path, values, force=args.force)
    say(f"wrote {written}")
    return 0


def update(args: argparse.Namespace) -> int:
    """`accel config update`: rewrite an old file with today's keys."""
    from accel_cli._migrate import rewrite, update_config

    path = _existing(args.config_file)
    values, changes = update_config(read_config_data(path))
    if not changes:
        print(f"{path}: already up to date")
        return 0
    rewrite(path, values, path)
    for change in changes:
        print(f"- {change}")
    print(f"updated {path}")
    return 0


def _existing(config_file: str | None) -> Path:
    found = find_config_file(config_file, os.environ)
    if found is None:
        raise ConfigError(
            f"No config file: pass --config_file, or create {default_config_path()} with "
            f"`accel config`."
        )
    return found[0]


def show(args: argparse.Namespace) -> int:
    """`accel config show`: every resolved value and where it comes from."""
    flags = launch_values(args, LAUNCH_FIELDS)
    file = load(args.config_file, os.environ)
    resolution = resolve_launch_config(flags, file, environment_values(flags))
    shown = shown_values(resolution, file, os.environ)
    if args.json:
        where = None if file is None else {"path": str(file.path), "origin": file.origin}
        print(json.dumps({"config_file": where, "values": shown}, indent=2))
        return 0
    if file is None:
        print(f"config file: none (the default location {default_config_path()} has no file)")
    else:
        print(f"config file: {file.path} ({file.origin})")
    for name, item in shown.items():
        print(f"{name}: {json.dumps(item['value'])}  [{item['source']}]")
    if file is not None and file.noted:
        print(f"accepted, acted on by neither tool at launch: {', '.join(file.noted)}")
    for refused in file.refused if file is not None else ():
        print(f"refused by accel launch: {refused}")
    for notice in resolution.notices:
        print(f"note: {notice}")
    return 0


def shown_values(
    resolution: Resolution, file: ConfigFile | None, environ: Mapping[str, str]
) -> dict[str, dict[str, object]]:
    """Each launch value (sections key by key) with its source: flag, file, environment,
    default."""
    config = resolution.config
    out: dict[str, dict[str, object]] = {}
    for name, value in vars(config).items():
        if name in ("handed_down", "explicit"):
            continue
        source = resolution.sources[name]
        variable = resolution.environment and resolution.environment.variables.get(name)
        if source == "environment" and variable:
            source = f"environment ({variable})"
        if name == "config_file" and file is not None and file.origin.startswith("$"):
            source = f"environment ({file.origin[1:]})"
        threads = environ.get(ENV_OMP_NUM_THREADS, "")
        if name == "num_cpu_threads_per_process" and source == "default" and threads.isdigit():
            value, source = int(threads), f"environment ({ENV_OMP_NUM_THREADS})"
        out[name] = {"value": value, "source": source}
    # Then every other key of the file, sections key by key, so nothing in it goes unseen.
    used = set(_schema.USED_KEYS) | ({"fp16"} if "mixed_precision" in out else set())
    for key, value in (file.data if file is not None else {}).items():
        if key in used:
            continue
        if isinstance(value, dict) and value:
            for sub, inner in value.items():
                out[f"{key}.{sub}"] = {"value": inner, "source": "file"}
        else:
            out[key] = {"value": value, "source": "file"}
    return out


def validate(args: argparse.Namespace) -> int:
    """`accel config validate`: load the file and resolve it; any problem is an error."""
    file = load(args.config_file, os.environ)
    if file is None:
        raise ConfigError(
            f"No config file to validate: pass --config_file, or create {default_config_path()} "
            f"with `accel config default`."
        )
    resolve_launch_config({}, file)
    print(f"{file.path}: ok")
    return 0
