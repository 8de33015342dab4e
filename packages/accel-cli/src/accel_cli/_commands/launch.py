"""`accel launch`: resolve the configuration, refuse what accel does not provide, then run the
script directly, or torchrun, DeepSpeed's runner or mpirun around it.

Neither this module nor the launch layer imports torch: the launcher starts in milliseconds
and leaves torch to the workers.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from accel_cli._command import (
    build_command,
    build_env,
    physical_cores,
    visible_gpus,
    with_rendezvous,
)
from accel_cli._commands._common import load, report, say
from accel_cli._commands._launch_args import (
    FIELD_FLAGS,
    LAUNCH_FIELDS,
    add_launch_arguments,
    given_view,
    launch_parser_kwargs,
    launch_values,
    slurm_values,
)
from accel_cli._config import ConfigError, ConfigFile
from accel_cli._environment import (
    ENV_ACCEL_CONFIG,
    ENV_AS_ACCELERATE,
    ENV_DEBUG_MODE,
    ENV_DISABLE_SHARED_STORE,
    ENV_OMP_NUM_THREADS,
    env_wants_cpu,
)
from accel_cli._flags import given_flags
from accel_cli._hang_report import report_hang, with_hang_note
from accel_cli._resolve import (
    TORCHRUN_SPELLINGS,
    check_launch,
    machine_range,
    resolve_launch_config,
)
from accel_cli._run import run_child
from accel_cli._sections import with_flag_sections

NAME = "launch"
HELP = "Run a training script on one or many processes and machines."
# What --dry_run prints besides the launch configuration, when the launch changes it.
_SHOWN_VARIABLES = (
    ENV_OMP_NUM_THREADS,
    "CUDA_VISIBLE_DEVICES",
    ENV_DEBUG_MODE,
    ENV_AS_ACCELERATE,
    ENV_DISABLE_SHARED_STORE,
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help=HELP, **launch_parser_kwargs())
    add_launch_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Resolve the configuration, refuse what accel does not provide, then run the script,
    torchrun or mpirun; return the child's exit code (0 after --dry_run)."""
    args = given_view(args)
    given = {**given_flags(args), "module": args.module}
    flags = launch_values(args, (*LAUNCH_FIELDS, "multi_gpu", *FIELD_FLAGS, *TORCHRUN_SPELLINGS))
    if "cpu" not in flags and env_wants_cpu(os.environ):
        flags["cpu"] = True  # --multi_gpu then means several CPU processes, as in accelerate
        flags.pop("multi_gpu", None)
    file = load(args.config_file, os.environ)
    if flags.get("multi_gpu"):
        on_cpu = _multi_gpu_processes(flags, file)
        flags.update(on_cpu)
        if on_cpu.get("cpu"):  # no GPU here: --multi_gpu means several CPU processes
            flags.pop("multi_gpu")
    resolution = resolve_launch_config(flags, file, slurm_values(flags))
    check_launch(resolution.config, given, file)
    report(file, resolution, args.quiet)
    config = with_rendezvous(with_flag_sections(resolution.config, given))
    if not args.module and not config.no_python and not Path(args.training_script).is_file():
        raise ConfigError(
            f"The script {args.training_script!r} does not exist (pass -m to run a module)."
        )
    hostfile = config.mpirun_hostfile
    if hostfile is not None and not Path(hostfile).expanduser().is_file():
        raise ConfigError(f"mpirun_hostfile {hostfile!r} does not exist.")
    cmd = build_command(
        config, args.training_script, args.training_script_args, module=bool(args.module)
    )
    cores = physical_cores() if config.cpu and config.nproc_per_node > 1 else None
    env = build_env(config, os.environ, cpu_cores=cores)
    if args.dry_run:
        print(shlex.join(cmd))
        for name in _SHOWN_VARIABLES:
            if env.get(name) != os.environ.get(name):
                print(f"{name}={env[name]}")
        print(f"{ENV_ACCEL_CONFIG}={env[ENV_ACCEL_CONFIG]}")
        return 0
    torchrun = config.distributed and config.mpirun_hostfile is None
    config, note = with_hang_note(config)  # not before --dry_run: it makes a file
    if note is not None:
        env = build_env(config, os.environ, cpu_cores=cores)
    code = run_child(cmd, env, through_torchrun=torchrun)
    return report_hang(note, code, config.num_processes)


def _multi_gpu_processes(flags: Mapping[str, object], file: ConfigFile | None) -> dict:
    """--multi_gpu: one process per visible GPU on each machine unless a count was given.
    Without GPUs, the count given runs as CPU processes over gloo (as accelerate's launch
    does), with a warning; without GPUs and without a count there is nothing to start."""
    if flags.get("cpu"):
        return {}  # LaunchConfig reports the contradiction
    count = visible_gpus(os.environ)
    file_values = file.values if file is not None else {}
    counted = "num_processes" in flags or file_values.get("num_processes", -1) != -1
    if count == 0 and counted:
        say(
            "warning: --multi_gpu, but this machine has no GPU visible: starting the processes "
            "on the CPU over gloo (pass --cpu to say so)."
        )
        return {"cpu": True}
    if count == 0:
        raise ConfigError(
            "--multi_gpu needs GPUs to count processes by, and this machine has none visible "
            "(no GPU driver, or CUDA_VISIBLE_DEVICES hides them). Pass --num_processes N to "
            "start N processes on the CPU, or use --cpu --num_processes N."
        )
    if counted:
        return {}
    if flags.get("gpu_ids", file_values.get("gpu_ids")) not in (None, "all"):
        return {}  # one process per listed GPU (the resolver's default)
    machines = flags.get("nnodes", flags.get("num_machines", file_values.get("num_machines", 1)))
    _, machines = machine_range(machines, "num_machines")
    return {"num_processes": count * machines}
