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
    environment_values,
    given_view,
    launch_parser_kwargs,
    launch_values,
)
from accel_cli._config import ConfigError, ConfigFile
from accel_cli._deepspeed import uses_deepspeed_runner
from accel_cli._environment import (
    ENV_ACCEL_CONFIG,
    ENV_AS_ACCELERATE,
    ENV_DEBUG_MODE,
    ENV_DISABLE_SHARED_STORE,
    ENV_OMP_NUM_THREADS,
    env_wants_cpu,
)
from accel_cli._flags import given_flags
from accel_cli._hang_report import HangWatch, with_hang_note
from accel_cli._launch_config import LaunchConfig
from accel_cli._network import (
    SOCKET_IFNAME_VARIABLES,
    NetworkError,
    is_local,
    route_to,
    socket_interface_env,
)
from accel_cli._preflight import DEFAULT_TIMEOUT as DEFAULT_PREFLIGHT_TIMEOUT
from accel_cli._preflight import PREFLIGHT_EXIT_CODE, preflight_wanted, run_preflight
from accel_cli._preflight import report as report_preflight
from accel_cli._preflight_scope import UNDER_TPU as PREFLIGHT_UNDER_TPU
from accel_cli._preflight_scope import unavailable as preflight_unavailable
from accel_cli._resolve import (
    TORCHRUN_SPELLINGS,
    check_launch,
    machine_range,
    resolve_launch_config,
)
from accel_cli._run import run_child
from accel_cli._sections import with_flag_sections
from accel_cli._slurm import slurm_default_port
from accel_cli._xla_launch import launch_tpu, tpu_wanted

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
    if tpu_wanted(given, flags, file):  # XLA devices through torch-xla's launcher
        if getattr(args, "preflight", None) in ("on", "strict"):
            raise ConfigError(PREFLIGHT_UNDER_TPU.error())
        return launch_tpu(given, flags, file, args, os.environ)
    if flags.get("multi_gpu"):
        on_cpu = _multi_gpu_processes(flags, file)
        flags.update(on_cpu)
        if on_cpu.get("cpu"):  # no GPU here: --multi_gpu means several CPU processes
            flags.pop("multi_gpu")
    resolution = resolve_launch_config(flags, file, environment_values(flags))
    check_launch(resolution.config, given, file)
    report(file, resolution, args.quiet)
    config = with_rendezvous(
        with_flag_sections(resolution.config, given), slurm_default_port(os.environ)
    )
    if not args.module and not config.no_python and not Path(args.training_script).is_file():
        raise ConfigError(
            f"The script {args.training_script!r} does not exist (pass -m to run a module)."
        )
    hostfile = config.mpirun_hostfile
    if hostfile is not None and not Path(hostfile).expanduser().is_file():
        raise ConfigError(f"mpirun_hostfile {hostfile!r} does not exist.")
    cores = physical_cores() if config.cpu and config.nproc_per_node > 1 else None
    network = _network_env(config, args)
    if isinstance(network, int):
        return network  # the preflight found the launch cannot work
    extra_env, local_addr, rdzv_host = network
    cmd = build_command(
        config,
        args.training_script,
        args.training_script_args,
        module=bool(args.module),
        local_addr=local_addr,
        rdzv_host=rdzv_host,
    )
    env = {**build_env(config, os.environ, cpu_cores=cores), **extra_env}
    if args.dry_run:
        _print_dry_run(config, cmd, env, every_machine=getattr(args, "preflight", None) is not None)
        return 0
    torchrun = config.distributed and config.mpirun_hostfile is None
    config, note = with_hang_note(config)  # not before --dry_run: it makes a file
    if note is not None:
        env = {**build_env(config, os.environ, cpu_cores=cores), **extra_env}
    with HangWatch(note, config.num_processes) as watch:  # removes the note however it ends
        code = run_child(cmd, env, through_torchrun=torchrun, on_poll=watch.poll)
        return watch.finish(code)


def _print_dry_run(
    config: LaunchConfig, cmd: list[str], env: Mapping[str, str], *, every_machine: bool
) -> None:
    """The command, the variables the launch changes, and the launch configuration; with
    `every_machine` (--preflight --dry_run), each machine's command under a `# machine N:`
    line."""
    if every_machine and config.num_machines > 1 and "--node-rank" in cmd:
        at = cmd.index("--node-rank") + 1
        for rank in range(config.num_machines):
            print(f"# machine {rank}:" + (" (this one)" if rank == config.machine_rank else ""))
            print(shlex.join([*cmd[:at], str(rank), *cmd[at + 1 :]]))
    else:
        print(shlex.join(cmd))
    for name in (*_SHOWN_VARIABLES, *SOCKET_IFNAME_VARIABLES):
        if env.get(name) != os.environ.get(name):
            print(f"{name}={env[name]}")
    print(f"{ENV_ACCEL_CONFIG}={env[ENV_ACCEL_CONFIG]}")


def _network_env(
    config: LaunchConfig, args: argparse.Namespace
) -> tuple[dict[str, str], str | None, bool] | int:
    """For a launch over several machines through torchrun: the preflight (unless turned
    off), then the interface variables that make gloo and NCCL talk on the network that
    reaches machine 0, this machine's address for torchrun's agents, and whether it holds
    the rendezvous endpoint's address. An exit code when the preflight found a launch that
    cannot work."""
    flag = getattr(args, "preflight", None)
    blocked = preflight_unavailable(config, deepspeed_runner=uses_deepspeed_runner(config))
    if blocked is not None:
        if flag in ("on", "strict"):
            raise ConfigError(blocked.error())
        if flag is None and config.num_machines > 1 and not args.dry_run:
            say(f"preflight: {blocked.note()}")
        return {}, None, False
    if args.dry_run and flag is None:
        return {}, None, False
    if preflight_wanted(config, flag):
        timeout = getattr(args, "preflight_timeout", None) or DEFAULT_PREFLIGHT_TIMEOUT
        tell = lambda text: say(f"preflight: {text}")  # noqa: E731
        outcome = run_preflight(
            config, os.environ, strict=flag == "strict", timeout=timeout, say=tell
        )
        report_preflight(outcome, tell)
        if outcome.fatal:
            return PREFLIGHT_EXIT_CODE
        route = outcome.route
    elif config.num_machines > 1:
        try:
            route = route_to(config.main_process_ip or "")
        except (NetworkError, OSError):
            route = None  # not checked, as asked: the rendezvous says what is wrong
    else:
        route = None
    if route is None or route.loopback or config.num_machines == 1:
        return {}, None, False
    env = socket_interface_env(route, os.environ)
    return env, route.local_address, is_local(route.main_address)


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
