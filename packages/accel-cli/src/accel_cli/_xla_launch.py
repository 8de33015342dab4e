"""`accel launch --tpu` (or `distributed_type: XLA` in the config file): the script's
`--main_training_function` on every XLA device of this host, through torch-xla's launcher.

The command is `python -m accel_cli._xla_entry [--num_processes N] --main_training_function F
[-m] SCRIPT [ARGS...]`, which imports the script and hands F to torch-xla's launcher
(`xmp.spawn`, what `torch_xla.launch` calls; see `_xla_entry`). What torch-xla 2.9 cannot do is refused here, before anything starts: the pod
launcher (`--tpu_use_cluster`: xla_dist, removed in torch-xla 2.1; every worker of a pod runs
its own `accel launch --tpu`, which `accel tpu-config` starts on all of them), fp16, a second
engine, several machines, `--no_python`. The launcher imports neither torch nor torch-xla.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_cli._command import build_env
from accel_cli._config import ConfigError, ConfigFile
from accel_cli._environment import ENV_ACCEL_CONFIG
from accel_cli._flags import TPU_POD
from accel_cli._launch_config import LaunchConfig
from accel_cli._resolve import check_launch, resolve_launch_config
from accel_cli._run import run_child

ENTRY = "accel_cli._xla_entry"
ENV_PJRT_DEVICE = "PJRT_DEVICE"  # torch-xla's device ("TPU", "CPU", ...), shown by --dry_run
# Flags the TPU path reads itself (the rest go through the ordinary resolution and refusals).
_OWN_FLAGS = ("tpu", "no_tpu_cluster", "main_training_function", "num_processes")
_POD_FLAGS = {"tpu_use_cluster": "--tpu_cluster", "tpu_use_sudo": "--tpu_use_sudo", "vm": "--vm",
              "env": "--env"}  # fmt: skip
_OTHER_ENGINES = ("cpu", "multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")


def tpu_wanted(given: Mapping[str, Any], flags: Mapping[str, Any], file: ConfigFile | None) -> bool:
    """--tpu, or a config file of `distributed_type: XLA` when no other kind of run is asked
    for on the command line (accelerate's rule)."""
    if given.get("tpu"):
        return True
    from_file = file is not None and file.data.get("distributed_type") == "XLA"
    return from_file and not any({**flags, **given}.get(name) for name in _OTHER_ENGINES)


def tpu_command(
    given: Mapping[str, Any],
    flags: Mapping[str, Any],
    file: ConfigFile | None,
    script: str,
    script_args: list[str],
    *,
    module: bool,
    no_python: bool,
) -> tuple[list[str], LaunchConfig]:
    """The entry's command line, and the workers' launch configuration; one
    ConfigError naming everything this launch asks for that an XLA launch cannot do."""
    data = file.data if file is not None else {}
    problems = [f"{_POD_FLAGS[n]}: {TPU_POD}." for n in _POD_FLAGS if given.get(n)]
    if data.get("tpu_use_cluster") and not given.get("no_tpu_cluster"):
        problems.append(f"tpu_use_cluster: true in {str(file.path)!r}: {TPU_POD}.")  # type: ignore[union-attr]
    asked = {**flags, **given}
    problems += [
        f"--tpu and --{n} contradict: an XLA launch is its own kind of run; pick one."
        for n in _OTHER_ENGINES
        if asked.get(n)
    ]
    if no_python:
        problems.append(
            "--no_python cannot be used with --tpu: torch-xla's launcher calls a Python function "
            "of the script (--main_training_function)."
        )
    num_processes = flags.get("num_processes", data.get("num_processes"))
    if num_processes in (-1, None):
        num_processes = None  # every device of this host, as torch-xla counts them
    elif int(num_processes) < 1:
        problems.append(f"--num_processes {num_processes}: expected 1 or more, or leave it out.")
    rest = {k: v for k, v in flags.items() if k not in ("num_processes", "cpu", "multi_gpu")}
    machines = rest.pop("num_machines", data.get("num_machines", 1))
    if int(machines or 1) > 1:
        problems.append(
            f"--num_machines {machines} with --tpu: the hosts of a TPU pod find each other "
            f"through the TPU runtime, not through accel; run `accel launch --tpu SCRIPT` on "
            f"every worker (`accel tpu-config --command 'accel launch --tpu SCRIPT'` does)."
        )
    mixed = rest.get("mixed_precision", data.get("mixed_precision"))
    if mixed in ("fp16", "fp16-true", "fp8"):
        problems.append(
            f"--mixed_precision {mixed}: XLA devices compute in bfloat16 here; use "
            f"--mixed_precision bf16."
        )
    if problems:
        lines = "\n  - ".join(dict.fromkeys(problems))
        raise ConfigError(f"accel launch --tpu cannot do what this run asks for:\n  - {lines}")
    resolution = resolve_launch_config(rest, _without_tpu_keys(file))
    others = {k: v for k, v in given.items() if k not in (*_OWN_FLAGS, *_OTHER_ENGINES)}
    check_launch(resolution.config, others, _without_tpu_keys(file))
    main = str(given.get("main_training_function") or data.get("main_training_function") or "main")
    cmd = [sys.executable, "-m", ENTRY]
    cmd += [] if num_processes is None else ["--num_processes", str(int(num_processes))]
    cmd += ["--main_training_function", main, *(["-m"] if module else []), script, *script_args]
    return cmd, resolution.config


def launch_tpu(
    given: Mapping[str, Any],
    flags: Mapping[str, Any],
    file: ConfigFile | None,
    args: Any,
    environ: Mapping[str, str],
) -> int:
    """Build the XLA launch from `args` (the parsed `accel launch` line); print it under
    --dry_run, else run it and return its exit code."""
    if not args.module and not Path(args.training_script).is_file():
        raise ConfigError(
            f"The script {args.training_script!r} does not exist (pass -m to run a module)."
        )
    cmd, config = tpu_command(
        given,
        flags,
        file,
        args.training_script,
        list(args.training_script_args),
        module=bool(args.module),
        no_python=bool(getattr(args, "no_python", False)),
    )
    env = build_env(config, environ)  # the workers' configuration, as any launch hands it
    if args.dry_run:
        print(shlex.join(cmd))
        if ENV_PJRT_DEVICE in env:
            print(f"{ENV_PJRT_DEVICE}={env[ENV_PJRT_DEVICE]}")
        print(f"{ENV_ACCEL_CONFIG}={env[ENV_ACCEL_CONFIG]}")
        return 0
    return run_child(cmd, env)


def _without_tpu_keys(file: ConfigFile | None) -> ConfigFile | None:
    """`file` as the ordinary resolution should see it: its process count is torch-xla's to
    decide, and the keys only a TPU launch reads are read here."""
    if file is None:
        return None
    values = {k: v for k, v in file.values.items() if k not in ("num_processes", "num_machines")}
    values.pop("cpu", None)
    return dataclasses.replace(file, values=values, noted=())
