"""The arguments of `accel launch`, and the flags of a parsed command line that set a
`LaunchConfig` field.

Flags use accelerate's spellings (`--num_processes`) and the dashed ones (`--num-processes`).
Launch flags default to None, so resolution can tell a flag the user gave from one left out;
`given_view` does the same for a namespace built with accelerate's defaults.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Mapping
from typing import Any

from accel_cli import _flags, _schema
from accel_cli._argparse import CustomHelpFormatter
from accel_cli._command import visible_gpus
from accel_cli._commands._common import add_flag
from accel_cli._operators import operator_launch_values
from accel_cli._resolve import FromEnvironment
from accel_cli._slurm import slurm_launch_values

# Launch flags that map to a LaunchConfig field: (flag name, type, help).
LAUNCH_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("num_processes", int, "Total processes across all machines (default: 1 per machine)."),
    ("num_machines", int, "Number of machines (default 1)."),
    ("machine_rank", int, "This machine's index, 0 for the main machine (default 0)."),
    ("main_process_ip", str, "Address of machine 0 (needed with several machines)."),
    (
        "main_process_port",
        int,
        "Rendezvous port (default: a free port on one machine, 29500 on several).",
    ),
    ("gpu_ids", str, "GPUs to use on each machine, such as '0,1' (sets CUDA_VISIBLE_DEVICES)."),
    ("gradient_accumulation_steps", int, "Gradient accumulation steps handed to the Accelerator."),
    ("backend", str, "Process-group backend (default: nccl on CUDA, gloo on CPU)."),
    ("rdzv_backend", str, "torchrun rendezvous: static (default), c10d, etcd, etcd-v2."),
    ("max_restarts", int, "torchrun: restarts allowed before the job fails (default 0)."),
    ("num_cpu_threads_per_process", int, "OMP_NUM_THREADS of each process."),
)
METAVARS = {"main_process_ip": "IP", "gpu_ids": "IDS", "backend": "NAME", "rdzv_backend": "NAME"}
# The LaunchConfig fields `accel launch` and `accel config show` take as flags.
LAUNCH_FIELDS = ("cpu", "mixed_precision", *(name for name, _, _ in LAUNCH_FLAGS))
# Flags of `_flags.FLAGS` that set a LaunchConfig field of the same name.
FIELD_FLAGS = (
    "multi_gpu",
    "same_network",
    "enable_cpu_affinity",
    "debug",
    "as_accelerate",
    "step_metrics",
    "hang_timeout",
    "mpirun_hostfile",
    "tee",
    "log_dir",
    "role",
    "rdzv_conf",
    "rdzv_id",
    "monitor_interval",
    "no_python",
)


def launch_parser_kwargs() -> dict[str, object]:
    """The keyword arguments of the `accel launch` parser (its description and help format)."""
    return dict(
        allow_abbrev=False,
        formatter_class=CustomHelpFormatter,
        description=(
            "Flags take either spelling (--num_processes=2 or --num-processes=2). "
            "Run SCRIPT (or -m MODULE) with its arguments. More than one process in all goes "
            "through torchrun; one process runs the script directly. The configuration is "
            "resolved once (flags > config file > defaults) and handed to every worker in "
            "$ACCEL_LAUNCH_CONFIG. Every flag of `accelerate launch` is accepted: honoured, or "
            "refused before anything starts with the reason (see the refused groups below)."
        ),
    )


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """Add every `accel launch` flag and the SCRIPT positional to `p`."""
    add_flag(
        p, "config_file", metavar="PATH", help="Config file to read instead of the default one."
    )
    add_flag(p, "cpu", action="store_true", help="Run on the CPU even when GPUs are visible.")
    p.add_argument(
        "--no_cpu",
        "--no-cpu",
        dest="cpu",
        action="store_false",
        default=None,
        help="Use the accelerator even when the config file says use_cpu: true.",
    )
    add_flag(p, "mixed_precision", choices=_schema.PRECISIONS, help="Mixed precision mode.")
    for name, kind, text in LAUNCH_FLAGS:
        add_flag(p, name, type=kind, metavar=METAVARS.get(name, "N"), help=text)
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        default=None,
        help="Treat SCRIPT as a module name, as `python -m` does.",
    )
    add_flag(
        p,
        "multi_gpu",
        action="store_true",
        help="One process per visible GPU (num_processes defaults to the GPU count); an error "
        "on a machine without GPUs.",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=None,
        help="Print no informational lines (overrides are still reported).",
    )
    p.add_argument(
        "--as_accelerate",
        "--as-accelerate",
        action="store_true",
        default=None,
        help="In every process, `import accelerate` imports accel (sets ACCEL_AS_ACCELERATE=1): "
        "transformers' Trainer, PEFT and other accelerate clients run on accel.",
    )
    p.add_argument(
        "--step_metrics",
        "--step-metrics",
        action="store_true",
        default=None,
        help="Every Accelerator in the workers logs step metrics (Accelerator("
        "log_step_metrics=True)): samples/s, tokens/s, FLOPs, MFU, peak memory, data wait.",
    )
    p.add_argument(
        "--hang_timeout",
        "--hang-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="Diagnose a hang instead of waiting it out: when a step or a collective takes "
        "longer on any process, every process writes its stack and its last collectives to "
        "hang_report/, the launcher prints the first divergence between processes, and the "
        "job ends with exit code 86 (Accelerator(hang_timeout=SECONDS)).",
    )
    p.add_argument(
        "--dry_run",
        "--dry-run",
        action="store_true",
        help="Print the command and the configuration, run nothing.",
    )
    add_preflight_arguments(p)
    _flags.add_flags(p)
    p.add_argument(
        "training_script", metavar="SCRIPT", help="The training script (or module with -m)."
    )
    p.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script."
    )


def add_preflight_arguments(p: argparse.ArgumentParser) -> None:
    """--preflight [strict], --no_preflight and --preflight_timeout (launcher-only flags)."""
    p.add_argument(
        "--preflight",
        nargs="?",
        const="on",
        choices=("on", "strict"),
        default=None,
        help="Check a multi-machine launch before any worker waits (on by default with "
        "--num_machines above 1; this forces it on one machine): the main address is routed "
        "to, the port is free, every machine_rank arrives once, the machines agree on the world "
        "and the training settings. 'strict' makes a disagreement in training settings an "
        "error instead of a warning. With --dry_run: run the checks, print each host's "
        "command, start nothing.",
    )
    p.add_argument(
        "--no_preflight",
        "--no-preflight",
        dest="preflight",
        action="store_const",
        const="off",
        help="Skip the preflight of a multi-machine launch.",
    )
    p.add_argument(
        "--preflight_timeout",
        "--preflight-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="How long the preflight waits for every machine to arrive (default 900, as "
        "torchrun's rendezvous); the missing ones are named every 10 s meanwhile.",
    )


def launch_parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser):
    """A standalone parser of the `accel launch` arguments (an instance of `cls`)."""
    p = cls(prog="accel launch", **launch_parser_kwargs())
    add_launch_arguments(p)
    return p


def launch_values(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The flags among `names` that `args` has set (not None), by name."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def environment_values(flags: Mapping[str, object]) -> FromEnvironment | None:
    """What the environment says of the launch: a Kubernetes operator's variables (torchrun's
    PET_ ones and the others `_operators` reads), else the SLURM allocation's machines unless
    --num_machines (or --nnodes) takes the topology in hand; None where neither is set."""
    found = operator_launch_values(os.environ, gpus=lambda: visible_gpus(os.environ))
    if found is not None:
        return found
    if "num_machines" in flags or "nnodes" in flags:
        return None
    slurm = slurm_launch_values(os.environ)
    return FromEnvironment("the SLURM allocation", slurm, kind="slurm") if slurm else None


@functools.lru_cache(maxsize=1)
def launch_defaults() -> dict[str, Any]:
    """Each `accel launch` dest and accelerate's default for it (False for switches)."""
    out: dict[str, Any] = {}
    for action in launch_parser()._actions:
        if action.dest in ("help", "training_script", "training_script_args"):
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            out.setdefault(action.dest, False)
        elif action.dest in _flags.BY_NAME:
            out[action.dest] = _flags.BY_NAME[action.dest].default
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
