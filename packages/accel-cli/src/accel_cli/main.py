"""The `accel` command: launch, config (questionnaire, default, show, validate, update),
env, estimate-memory, test, to-fsdp2.

Neither this module nor the launch and config commands import torch: the launcher starts in
milliseconds and leaves torch to the workers. `accel env` and `accel test` import it, and
`accel estimate-memory` only for MODULE:FACTORY.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from accel_cli import _schema
from accel_cli._command import (
    build_command,
    build_env,
    physical_cores,
    visible_gpus,
    with_rendezvous,
)
from accel_cli._config import (
    ConfigError,
    ConfigFile,
    ConfigFileNotFound,
    config_from_data,
    default_file_values,
    find_config_file,
    load_config_file,
    read_config_data,
    write_config_file,
)
from accel_cli._environment import (
    ENV_ACCEL_CONFIG,
    ENV_AS_ACCELERATE,
    ENV_DEBUG_MODE,
    ENV_DISABLE_SHARED_STORE,
    ENV_OMP_NUM_THREADS,
    default_config_path,
)
from accel_cli._familiar import env_wants_cpu, given_view
from accel_cli._flags import given_flags
from accel_cli._parser import _LAUNCH_FLAGS, build_parser, suggest_flag
from accel_cli._refusals import check_launch, with_flag_sections
from accel_cli._resolve import (
    TORCHRUN_SPELLINGS,
    Resolution,
    machine_range,
    resolve_launch_config,
)
from accel_cli._run import run_child
from accel_cli._slurm import slurm_launch_values

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
                f"note: {file.path} sets {', '.join(file.noted)}, which neither accel nor "
                f"accelerate acts on at launch"
            )
    for notice in resolution.notices:
        _say(notice)


# Flags of `_flags.FLAGS` that set a LaunchConfig field of the same name.
_FIELD_FLAGS = (
    "multi_gpu",
    "same_network",
    "enable_cpu_affinity",
    "debug",
    "as_accelerate",
    "mpirun_hostfile",
    "tee",
    "log_dir",
    "role",
    "rdzv_conf",
    "rdzv_id",
    "monitor_interval",
    "no_python",
)


def _slurm(flags: Mapping[str, object]) -> dict[str, object]:
    """The SLURM allocation's machines, unless --num_machines (or --nnodes) takes the topology
    in hand."""
    if "num_machines" in flags or "nnodes" in flags:
        return {}
    return slurm_launch_values(os.environ)


def launch_command(args: argparse.Namespace) -> int:
    """`accel launch`: resolve the configuration, refuse what accel does not provide, then
    run the script, torchrun or mpirun."""
    args = given_view(args)
    given = {**given_flags(args), "module": args.module}
    flags = {
        name: getattr(args, name)
        for name in (*_LAUNCH_FIELDS, "multi_gpu", *_FIELD_FLAGS, *TORCHRUN_SPELLINGS)
        if getattr(args, name) is not None
    }
    if "cpu" not in flags and env_wants_cpu(os.environ):
        flags["cpu"] = True  # --multi_gpu then means several CPU processes, as in accelerate
        flags.pop("multi_gpu", None)
    file = _load(args.config_file, os.environ)
    if flags.get("multi_gpu"):
        on_cpu = _multi_gpu_processes(flags, file)
        flags.update(on_cpu)
        if on_cpu.get("cpu"):  # no GPU here: --multi_gpu means several CPU processes
            flags.pop("multi_gpu")
    resolution = resolve_launch_config(flags, file, _slurm(flags))
    check_launch(resolution.config, given, file)
    _report(file, resolution, args.quiet)
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
        for name in (
            ENV_OMP_NUM_THREADS,
            "CUDA_VISIBLE_DEVICES",
            ENV_DEBUG_MODE,
            ENV_AS_ACCELERATE,
            ENV_DISABLE_SHARED_STORE,
        ):
            if env.get(name) != os.environ.get(name):
                print(f"{name}={env[name]}")
        print(f"{ENV_ACCEL_CONFIG}={env[ENV_ACCEL_CONFIG]}")
        return 0
    torchrun = config.distributed and config.mpirun_hostfile is None
    return run_child(cmd, env, through_torchrun=torchrun)


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
        _say(
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


def config_questionnaire_command(args: argparse.Namespace) -> int:
    """`accel config`: ask, then write the answers as a config file."""
    from accel_cli._questionnaire import Asker, run_questionnaire

    path = Path(args.questionnaire_file) if args.questionnaire_file else default_config_path()
    asker = Asker()
    if (
        path.exists()
        and not args.questionnaire_force
        and not asker.yes(f"{path} exists. Replace it?")
    ):
        _say(f"kept {path}")
        return 1
    values = run_questionnaire(asker)
    config_from_data(values, path)  # written files always validate
    written = write_config_file(path, values, force=True)
    _say(f"wrote {written}; check it with `accel config show --config_file {written}`")
    return 0


def config_update_command(args: argparse.Namespace) -> int:
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


def to_fsdp2_command(args: argparse.Namespace, load_config: Callable | None = None) -> int:
    """`accel to-fsdp2`: convert the FSDP1 settings of a config file to FSDP2 (`load_config`
    reads the file's mapping; default `_migrate.load_config`)."""
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
    rewrite = _migrate.rewrite
    rewrite(source, values, target)
    for note in notes:
        _say(note)
    _say(f"wrote {target}")
    return 0


def _existing(config_file: str | None) -> Path:
    found = find_config_file(config_file, os.environ)
    if found is None:
        raise ConfigError(
            f"No config file: pass --config_file, or create {default_config_path()} with "
            f"`accel config`."
        )
    return found[0]


def config_show_command(args: argparse.Namespace) -> int:
    """`accel config show`: every resolved value and where it comes from."""
    flags = {
        name: getattr(args, name) for name in _LAUNCH_FIELDS if getattr(args, name) is not None
    }
    file = _load(args.config_file, os.environ)
    resolution = resolve_launch_config(flags, file, _slurm(flags))
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


def estimate_memory_command(args: argparse.Namespace) -> int:
    """`accel estimate-memory SOURCE`: load and training memory, offline."""
    from accel_cli._estimate import estimate_command

    return estimate_command(args)


def test_command(args: argparse.Namespace) -> int:
    """`accel test`: launch the built-in check with the configuration, report each part."""
    from accel_cli._selftest import run_selftest

    file = _load(args.config_file, os.environ)
    resolution = resolve_launch_config({}, file)
    check_launch(resolution.config, {}, file)
    _report(file, resolution, quiet=False)
    config = resolution.config
    where = "CPU" if config.cpu else "accelerators"
    print(
        f"accel test: {config.num_processes} process(es) on {config.num_machines} machine(s), "
        f"{where}, mixed precision {config.mixed_precision}"
    )
    return run_selftest(config, args.timeout, print)


def merge_weights_command(args: argparse.Namespace) -> int:
    """`accel merge-weights`: a sharded FSDP2 model save -> one weights file (accel-parallel)."""
    try:
        from accel_parallel import merge_fsdp_weights
    except ImportError as err:
        raise SystemExit(
            f"accel merge-weights needs accel-parallel ({err}): pip install accel-parallel"
        ) from err

    out = merge_fsdp_weights(
        args.checkpoint_directory,
        args.output_path,
        safe_serialization=not args.unsafe_serialization,
        remove_checkpoint_dir=args.remove_checkpoint_dir,
    )
    _say(f"wrote the merged weights to {out}")
    return 0


def tpu_config_command(args: argparse.Namespace) -> int:
    """`accel tpu-config`: the gcloud command that sets up every worker of a TPU VM."""
    from accel_cli._tpu import tpu_command_launcher

    try:
        tpu_command_launcher(args)
    except ValueError as err:
        _say(f"error: {err}")
        return 2
    return 0


_COMMANDS = {
    ("launch", None): launch_command,
    ("config", None): config_questionnaire_command,
    ("config", "default"): config_default_command,
    ("config", "show"): config_show_command,
    ("config", "validate"): config_validate_command,
    ("config", "update"): config_update_command,
    ("env", None): env_command,
    ("estimate-memory", None): estimate_memory_command,
    ("test", None): test_command,
    ("to-fsdp2", None): to_fsdp2_command,
    ("merge-weights", None): merge_weights_command,
    ("tpu-config", None): tpu_config_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `accel` command line; return the exit code (the child's, for launch)."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        args.nondefault = {k for k, v in vars(args).items() if v is not None}
        if extras:
            parser.error(
                f"unrecognized arguments: {' '.join(extras)}.{suggest_flag(parser, extras[0])}"
            )
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 2
    name = getattr(args, "subcommand", None) or args.command
    command = _COMMANDS[(name, getattr(args, "config_command", None))]
    try:
        return command(args)
    except ConfigError as err:
        _say(f"error: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
