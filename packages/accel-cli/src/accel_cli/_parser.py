"""The argument parser of the `accel` command and its subcommands.

Flags use accelerate's spellings (`--num_processes`) and the dashed ones (`--num-processes`).
Launch flags default to None, so resolution can tell a flag the user gave from one left out.
"""

from __future__ import annotations

import argparse
import difflib

from accel_cli import _flags, _schema
from accel_cli._argparse import CustomHelpFormatter

# Launch flags that map to a LaunchConfig field: (flag name, type, help).
_LAUNCH_FLAGS: tuple[tuple[str, type, str], ...] = (
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


_METAVARS = {"main_process_ip": "IP", "gpu_ids": "IDS", "backend": "NAME", "rdzv_backend": "NAME"}


def _add_flag(parser: argparse.ArgumentParser, name: str, **kwargs: object) -> None:
    spellings = [f"--{name}"]
    if "_" in name:
        spellings.append(f"--{name.replace('_', '-')}")
    parser.add_argument(*spellings, dest=name, default=None, **kwargs)


_LAUNCH_HELP = "Run a training script on one or many processes and machines."


def _add_launch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help=_LAUNCH_HELP, **_launch_parser_kwargs())
    add_launch_arguments(p)


def _launch_parser_kwargs() -> dict[str, object]:
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
    _add_flag(
        p, "config_file", metavar="PATH", help="Config file to read instead of the default one."
    )
    _add_flag(p, "cpu", action="store_true", help="Run on the CPU even when GPUs are visible.")
    p.add_argument(
        "--no_cpu",
        "--no-cpu",
        dest="cpu",
        action="store_false",
        default=None,
        help="Use the accelerator even when the config file says use_cpu: true.",
    )
    _add_flag(p, "mixed_precision", choices=_schema.PRECISIONS, help="Mixed precision mode.")
    for name, kind, text in _LAUNCH_FLAGS:
        _add_flag(p, name, type=kind, metavar=_METAVARS.get(name, "N"), help=text)
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        default=None,
        help="Treat SCRIPT as a module name, as `python -m` does.",
    )
    _add_flag(
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
        "--dry_run",
        "--dry-run",
        action="store_true",
        help="Print the command and the configuration, run nothing.",
    )
    _flags.add_flags(p)
    p.add_argument(
        "training_script", metavar="SCRIPT", help="The training script (or module with -m)."
    )
    p.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="Arguments for the script."
    )


def _add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="Answer a few questions to write a config file, or write, show, check, update one.",
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
    _add_flag(
        d, "config_file", metavar="PATH", help="Where to write (default: the default config path)."
    )
    _add_flag(
        d, "mixed_precision", choices=_schema.PRECISIONS, help="Mixed precision mode (default no)."
    )
    _add_flag(d, "cpu", action="store_true", help="Run on the CPU.")
    _add_flag(d, "num_processes", type=int, metavar="N", help="Processes to launch (default 1).")
    d.add_argument("--force", action="store_true", help="Overwrite an existing file.")
    show_text = (
        "Print the resolved launch configuration and where each value comes from (flag, file, "
        "environment, default). Takes the launch flags, to show what they would change."
    )
    s = csub.add_parser("show", help=show_text, description=show_text)
    _add_flag(s, "config_file", metavar="PATH", help="The file to read (default: the default one).")
    _add_flag(s, "cpu", action="store_true", help="As `accel launch --cpu`.")
    _add_flag(s, "mixed_precision", choices=_schema.PRECISIONS, help="As `accel launch`.")
    for name, kind, _text in _LAUNCH_FLAGS:
        _add_flag(s, name, type=kind, metavar=_METAVARS.get(name, "N"), help="As `accel launch`.")
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
        _add_flag(
            c,
            "config_file",
            metavar="PATH",
            help="The file to read (default: the default config file).",
        )


def _add_to_fsdp2(sub: argparse._SubParsersAction) -> None:
    text = (
        "Convert a config file's FSDP1 settings to FSDP2: fsdp_sharding_strategy becomes "
        "fsdp_reshard_after_forward, fsdp_version becomes 2, and the keys FSDP2 does not have "
        "(fsdp_backward_prefetch, fsdp_forward_prefetch, fsdp_sync_module_states, "
        "fsdp_use_orig_params) are dropped."
    )
    p = sub.add_parser("to-fsdp2", help="Convert an FSDP1 config file to FSDP2.", description=text)
    _add_flag(p, "config_file", metavar="PATH", required=True, help="The file to convert.")
    _add_flag(p, "output_file", metavar="PATH", help="Where to write the converted file.")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace --config_file (or an existing --output_file) with the converted file.",
    )


def _add_estimate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate-memory",
        help="Estimate the memory a model needs to load and to train, offline.",
        description="SOURCE is a folder with a transformers-style config.json, a .safetensors "
        "file or a folder of shards (only the headers are read), or MODULE:FACTORY, a function "
        "that builds a torch model (built on the meta device, so no memory is used). Prints "
        "per dtype the largest layer, the total and training with Adam, then per-process "
        "figures for DDP, FSDP2 and ZeRO-1/2/3 and an activation estimate.",
    )
    # accelerate names the positional `model_name`; scripts and tests read it by that name.
    p.add_argument(
        "model_name", metavar="SOURCE", help="Folder, .safetensors file or MODULE:FACTORY."
    )
    p.add_argument(
        "--dtypes",
        nargs="+",
        metavar="DTYPE",
        default=["float32", "float16", "int8", "int4"],
        choices=["float32", "float16", "bfloat16", "int8", "int4"],
        help="Rows of the table (default: float32 float16 int8 int4).",
    )
    _add_flag(
        p, "num_processes", type=int, metavar="N", help="Processes for the per-process figures."
    )
    _add_flag(p, "batch_size", type=int, metavar="N", help="Per-process batch for activations.")
    _add_flag(p, "seq_len", type=int, metavar="N", help="Sequence length for activations.")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead.")


def _add_test(sub: argparse._SubParsersAction) -> None:
    text = (
        "Check the configured setup end to end: launch the processes with the config file, "
        "run collectives, train a few steps and compare with one process, save and load a "
        "checkpoint. Reports pass or fail for each part."
    )
    p = sub.add_parser("test", help="Check that the configured setup works.", description=text)
    _add_flag(p, "config_file", metavar="PATH", help="The file to test (default: the default one).")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="Stop the check after this long (default 300).",
    )


def _add_merge_weights(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge-weights",
        help="Merge a sharded FSDP2 model save into plain safetensors weights.",
        description="CHECKPOINT_DIR is a model's sharded folder written by save_state under "
        "FSDP2 (CKPT/pytorch_model_fsdp_0), or the checkpoint folder holding exactly one; "
        "OUTPUT is the folder to write model.safetensors (pytorch_model.bin with "
        "--unsafe_serialization) into. Runs in one process, without a process group.",
    )
    p.add_argument("checkpoint_directory", metavar="CHECKPOINT_DIR")
    p.add_argument("output_path", metavar="OUTPUT")
    p.add_argument(
        "--unsafe_serialization", action="store_true", help="Write pytorch_model.bin instead."
    )
    p.add_argument(
        "--remove_checkpoint_dir", action="store_true", help="Delete CHECKPOINT_DIR afterwards."
    )


def launch_parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser):
    """A standalone parser of the `accel launch` arguments (an instance of `cls`)."""
    p = cls(prog="accel launch", **_launch_parser_kwargs())
    add_launch_arguments(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel",
        allow_abbrev=False,
        description="accel: launch, configure and inspect PyTorch training runs.",
    )
    sub = parser.add_subparsers(
        dest="command",
        metavar="{launch,config,env,estimate-memory,test,to-fsdp2,merge-weights,tpu-config}",
        required=True,
    )
    _add_launch(sub)
    _add_config(sub)
    sub.add_parser(
        "env",
        help="Print the environment for a bug report.",
        description="Print versions, devices, memory and the default config, for a bug report.",
    )
    _add_estimate(sub)
    _add_test(sub)
    _add_to_fsdp2(sub)
    _add_merge_weights(sub)
    from accel_cli._tpu import tpu_command_parser

    tpu = tpu_command_parser(sub)  # its --command would hide the subcommand's name
    tpu.set_defaults(subcommand="tpu-config")
    return parser


def suggest_flag(parser: argparse.ArgumentParser, unknown: str) -> str:
    """' Did you mean --x?' for an unknown flag, or '' when nothing is close."""
    flag = unknown.split("=", 1)[0]
    known = sorted(_option_strings(parser))
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
    return f" Did you mean {close[0]}?" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _option_strings(child)
    return found
