"""`accel launch` driven the way code written for accelerate drives `accelerate launch`:
through an argparse namespace with accelerate's defaults (`launch_command_parser()`), which
`_validate_launch_command` fills from the config file, and from which
`prepare_simple_launcher_cmd_env` / `prepare_multi_gpu_env` build the child's command and
environment. All of them go through the one resolver `accel launch` uses.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from accel_cli._environment import ENV_USE_CPU
from accel_cli._flags import BY_NAME, SECTION_KEYS

_TRUE = ("1", "true", "yes", "y", "on", "t")


def env_wants_cpu(environ: Mapping[str, str]) -> bool:
    """Whether $ACCEL_USE_CPU or $ACCELERATE_USE_CPU asks for a CPU run."""
    return any(str(environ.get(name, "")).strip().lower() in _TRUE for name in ENV_USE_CPU)


@functools.lru_cache(maxsize=1)
def launch_defaults() -> dict[str, Any]:
    """Each `accel launch` dest and accelerate's default for it (False for switches)."""
    from accel_cli._parser import launch_parser

    out: dict[str, Any] = {}
    for action in launch_parser()._actions:
        if action.dest in ("help", "training_script", "training_script_args"):
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            out.setdefault(action.dest, False)
        elif action.dest in BY_NAME:
            out[action.dest] = BY_NAME[action.dest].default
        else:
            out.setdefault(action.dest, None)
    return out


def _same(value: Any, default: Any) -> bool:
    if value == default:
        return True
    if isinstance(value, bool) or isinstance(default, bool) or value is None or default is None:
        return False
    return str(value).strip().lower() == str(default).strip().lower()


def given_view(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with every launch flag the command line (or code) did not set put back to None.

    A flag counts as given when the parser recorded it (`args.nondefault`) or when its value
    differs from accelerate's default, so namespaces made by hand or edited after parsing
    work too. Other attributes are copied unchanged.
    """
    recorded = set(getattr(args, "nondefault", ()) or ())
    out = argparse.Namespace(**vars(args))
    for dest, default in launch_defaults().items():
        value = getattr(args, dest, None)
        if dest not in recorded and (value is None or _same(value, default)):
            value = None
        setattr(out, dest, value)
    if getattr(out, "training_script", None) is None and hasattr(args, "script"):
        out.training_script = args.script
    out.training_script_args = list(getattr(out, "training_script_args", None) or [])
    out.dry_run = bool(getattr(args, "dry_run", False))
    return out


class LaunchArgumentParser(argparse.ArgumentParser):
    """The `accel launch` parser as `launch_command_parser()` returns it: flags left out
    take accelerate's defaults, and `namespace.nondefault` names the flags given."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        given = {d for d in launch_defaults() if getattr(namespace, d, None) is not None}
        if not namespace.dry_run:
            given.discard("dry_run")
        for dest, default in launch_defaults().items():
            if getattr(namespace, dest, None) is None:
                setattr(namespace, dest, default)
        namespace.nondefault = given | set(getattr(namespace, "nondefault", ()) or ())
        return namespace, extras


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `accel launch` parser, with accelerate's defaults; added to `subparsers` when
    given (as `launch`)."""
    from accel_cli._parser import _launch_parser_kwargs, add_launch_arguments, launch_parser

    if subparsers is None:
        return launch_parser(LaunchArgumentParser)
    parser = subparsers.add_parser("launch", **_launch_parser_kwargs())
    add_launch_arguments(parser)
    parser.set_defaults(func=launch_command)
    return parser


def launch_command(args: argparse.Namespace) -> None:
    """Run the launch `args` describe; a failed run raises CalledProcessError (a refused
    configuration raises ValueError)."""
    from accel_cli.main import launch_command as run

    code = run(args)
    if code:
        script = getattr(args, "training_script", None) or getattr(args, "script", "")
        raise subprocess.CalledProcessError(code, ["accel", "launch", str(script)])


# Section key -> the launch flag that carries it (fsdp_config.fsdp_version -> fsdp_version).
_SECTION_FLAGS = {(section, key): flag for flag, (section, key) in SECTION_KEYS.items()}
_TYPE_FLAGS = {"FSDP": "use_fsdp", "DEEPSPEED": "use_deepspeed", "MEGATRON_LM": "use_megatron_lm"}


def _resolution(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(given view, config file or None, resolved LaunchConfig with the flag sections)."""
    from accel_cli._refusals import with_flag_sections
    from accel_cli._resolve import resolve_launch_config
    from accel_cli.main import _FIELD_FLAGS, _LAUNCH_FIELDS, _load

    view = given_view(args)
    flags = {
        name: getattr(view, name)
        for name in (*_LAUNCH_FIELDS, "multi_gpu", *_FIELD_FLAGS)
        if getattr(view, name, None) is not None
    }
    if "cpu" not in flags and env_wants_cpu(os.environ):
        flags["cpu"] = True
        flags.pop("multi_gpu", None)
    file = _load(getattr(view, "config_file", None), os.environ)
    from accel_cli._flags import given_flags

    config = resolve_launch_config(flags, file).config
    config = with_flag_sections(config, given_flags(view))
    return view, file, config


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Fill `args` from the config file in effect where no flag was given, as accelerate
    does; return (args, the file's ClusterConfig or None, whether mixed precision came from
    the file)."""
    from accel_cli._config_args import load_config_from_file

    view, file, config = _resolution(args)
    for name, value in vars(config).items():
        if hasattr(args, name) and getattr(view, name, None) is None and name != "handed_down":
            setattr(args, name, value)
    for section, values in config.handed_down.items():
        if isinstance(values, Mapping):
            for key, value in values.items():
                flag = _SECTION_FLAGS.get((section, key), key)
                if hasattr(args, flag) and getattr(view, flag, None) is None:
                    setattr(args, flag, value)
        elif section == "distributed_type" and values in _TYPE_FLAGS:
            setattr(args, _TYPE_FLAGS[values], True)
    args.use_cpu = config.cpu
    if getattr(args, "num_cpu_threads_per_process", None) is None:
        threads = os.environ.get("OMP_NUM_THREADS", "")
        args.num_cpu_threads_per_process = int(threads) if threads.isdigit() else 1
    if getattr(args, "dynamo_backend", None) is None:
        args.dynamo_backend = "no"
    defaults = load_config_from_file(file.path) if file is not None else None
    from_file = file is not None and "mixed_precision" in file.values
    return args, defaults, from_file and getattr(view, "mixed_precision", None) is None


def prepare_simple_launcher_cmd_env(
    args: argparse.Namespace, *, which: Any = None, mpi_version: Any = None
) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of the child `accel launch` starts for `args`. `which` and
    `mpi_version` find the MPI launcher of a hostfile run (see `find_mpirun`)."""
    from accel_cli._command import (
        build_command,
        build_env,
        find_mpirun,
        physical_cores,
        with_rendezvous,
    )

    view, _, config = _resolution(args)
    if view.no_python and view.module:
        raise ValueError("--module and --no_python cannot be used together; pick one.")
    config = with_rendezvous(config)
    mpirun = None
    if config.mpirun_hostfile is not None:
        mpirun = find_mpirun(which, mpi_version)
    cmd = build_command(
        config,
        view.training_script,
        view.training_script_args,
        module=bool(view.module),
        mpirun=mpirun,
    )
    cores = physical_cores() if config.cpu and config.nproc_per_node > 1 else None
    return cmd, build_env(config, os.environ, cpu_cores=cores)


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of torchrun's workers for `args`; sets torchrun's arguments on `args`
    (nproc_per_node, nnodes, node_rank, master_addr, master_port; a port of 0 or none on one
    machine becomes a free port)."""
    import dataclasses

    from accel_cli._command import LOOPBACK, build_env, free_port

    _, _, config = _resolution(args)
    port = config.main_process_port
    if port is None:
        port = free_port() if config.num_machines == 1 else 29500
    config = dataclasses.replace(
        config, main_process_ip=config.main_process_ip or LOOPBACK, main_process_port=port
    )
    args.nproc_per_node = str(config.nproc_per_node)
    args.nnodes = config.nnodes  # "MIN:MAX" for an elastic run
    args.node_rank = str(config.machine_rank)
    args.master_addr = str(config.main_process_ip)
    args.master_port = str(port)
    return build_env(config, os.environ)


def _infer_type(text: str) -> Any:
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number // 1 == number else number


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """A script's `--key value` arguments as a dict with inferred types (int, float, bool,
    str). A flag without a value is a ValueError (SageMaker passes hyperparameters as
    key/value pairs only)."""
    from ast import literal_eval

    parser = argparse.ArgumentParser()
    _, unknown = parser.parse_known_args(nargs)
    for index, word in enumerate(unknown):
        if not word.startswith("-"):
            continue
        if index + 1 >= len(unknown) or unknown[index + 1].startswith("-"):
            raise ValueError(
                f"Script argument {word!r} has no value: SageMaker hyperparameters are "
                f"key/value pairs, so give it one (e.g. `{word} True`)."
            )
        parser.add_argument(word, type=_infer_type)
    return {
        key: literal_eval(value) if value in ("True", "False") else value
        for key, value in vars(parser.parse_args(nargs)).items()
    }
