"""`accel launch` driven the way code written for accelerate drives `accelerate launch`:
through an argparse namespace with accelerate's defaults (`launch_command_parser()`), which
`validate_launch_command` fills from the config file, and from which
`prepare_simple_launcher_cmd_env` / `prepare_multi_gpu_env` build the child's command and
environment. All of them go through the one resolver `accel launch` uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from accel_cli._command import (
    DEFAULT_MAIN_PROCESS_PORT,
    LOOPBACK,
    build_command,
    build_env,
    find_mpirun,
    free_port,
    physical_cores,
    with_rendezvous,
)
from accel_cli._commands import launch
from accel_cli._commands._common import load
from accel_cli._commands._launch_args import (
    FIELD_FLAGS,
    LAUNCH_FIELDS,
    add_launch_arguments,
    given_view,
    launch_defaults,
    launch_parser,
    launch_parser_kwargs,
    launch_values,
)
from accel_cli._config_args import load_config_from_file
from accel_cli._environment import env_wants_cpu
from accel_cli._flags import SECTION_KEYS, given_flags
from accel_cli._launch_config import LaunchConfig
from accel_cli._resolve import resolve_launch_config
from accel_cli._sections import with_flag_sections


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
    if subparsers is None:
        return launch_parser(LaunchArgumentParser)
    parser = subparsers.add_parser("launch", **launch_parser_kwargs())
    add_launch_arguments(parser)
    parser.set_defaults(func=launch_command)
    return parser


def launch_command(args: argparse.Namespace) -> None:
    """Run the launch `args` describe; a failed run raises CalledProcessError (a refused
    configuration raises ValueError)."""
    code = launch.run(args)
    if code:
        script = getattr(args, "training_script", None) or getattr(args, "script", "")
        raise subprocess.CalledProcessError(code, ["accel", "launch", str(script)])


# Section key -> the launch flag that carries it (fsdp_config.fsdp_version -> fsdp_version).
_SECTION_FLAGS = {(section, key): flag for flag, (section, key) in SECTION_KEYS.items()}
_TYPE_FLAGS = {"FSDP": "use_fsdp", "DEEPSPEED": "use_deepspeed", "MEGATRON_LM": "use_megatron_lm"}


def _resolution(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, LaunchConfig]:
    """(given view, config file or None, resolved LaunchConfig with the flag sections)."""
    view = given_view(args)
    flags = launch_values(view, (*LAUNCH_FIELDS, "multi_gpu", *FIELD_FLAGS))
    if "cpu" not in flags and env_wants_cpu(os.environ):
        flags["cpu"] = True
        flags.pop("multi_gpu", None)
    file = load(getattr(view, "config_file", None), os.environ)
    config = resolve_launch_config(flags, file).config
    config = with_flag_sections(config, given_flags(view))
    return view, file, config


def validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Fill `args` from the config file in effect where no flag was given, as accelerate
    does; return (args, the file's ClusterConfig or None, whether mixed precision came from
    the file)."""
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
    _, _, config = _resolution(args)
    port = config.main_process_port
    if port is None:
        port = free_port() if config.num_machines == 1 else DEFAULT_MAIN_PROCESS_PORT
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


def convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
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


def _on_tpu() -> bool:
    """accelerate's `is_torch_xla_available(check_is_tpu=True)`: torch-xla installed, not
    turned off (USE_TORCH_XLA=0), and its runtime's device a TPU."""
    import importlib.util

    from accel_state.xla_env import xla_opted_out

    if xla_opted_out(os.environ):
        return False
    if importlib.util.find_spec("torch_xla") is None:
        return False
    import torch_xla.runtime as xr

    return xr.device_type() == "TPU"


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """accelerate's: `XLA_USE_BF16=1` (or `XLA_DOWNCAST_BF16=1` with --downcast_bf16) for
    bf16 on a TPU, `ACCELERATE_DEBUG_MODE=true` for --debug; with `pod`, `args.vm` and
    `args.tpu` from --tpu_vm / --tpu_name. torch-xla 2.9 reads neither XLA variable any more:
    accel's workers compute bf16 through autocast, from the launch configuration."""
    if getattr(args, "mixed_precision", None) == "bf16" and _on_tpu():
        name = "XLA_DOWNCAST_BF16" if getattr(args, "downcast_bf16", False) else "XLA_USE_BF16"
        current_env[name] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "tpu_vm", None)
        args.tpu = getattr(args, "tpu_name", None)
    return args, current_env


def tpu_launcher(args: argparse.Namespace) -> None:
    """accelerate's: call the script's `main_training_function` once per XLA device of this
    host through torch-xla's launcher (what `accel launch --tpu` runs; see `_xla_entry`), with
    the launch's mixed precision; `num_processes` as torch-xla accepts it."""
    import json

    from accel_cli._environment import ENV_ACCEL_CONFIG
    from accel_cli._xla_entry import spawn

    if getattr(args, "no_python", False):
        raise ValueError("--no_python cannot be used with TPU launcher")
    args, env = prepare_tpu(args, {})
    mixed = getattr(args, "mixed_precision", None) or "no"
    env[ENV_ACCEL_CONFIG] = json.dumps({"mixed_precision": mixed})
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        spawn(
            args.training_script,
            getattr(args, "main_training_function", None) or "main",
            list(getattr(args, "training_script_args", None) or []),
            module=bool(getattr(args, "module", False)),
            num_processes=getattr(args, "num_processes", None),
        )
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
