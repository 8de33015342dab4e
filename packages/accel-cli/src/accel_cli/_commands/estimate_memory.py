"""`accel estimate-memory SOURCE`: the memory a model needs to load and to train, offline."""

from __future__ import annotations

import argparse
import json
import os

from accel_cli._commands._common import add_flag
from accel_cli._config import ConfigError

NAME = "estimate-memory"
HELP = "Estimate the memory a model needs to load and to train, offline."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help=HELP,
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
    add_flag(
        p, "num_processes", type=int, metavar="N", help="Processes for the per-process figures."
    )
    add_flag(p, "batch_size", type=int, metavar="N", help="Per-process batch for activations.")
    add_flag(p, "seq_len", type=int, metavar="N", help="Sequence length for activations.")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead.")
    train = p.add_argument_group(
        "training step (--train, --plan)",
        "Trace one forward, backward and optimizer step under fake tensors (nothing is "
        "allocated) with each engine applied; needs accel-parallel (and transformers for a "
        "config.json folder).",
    )
    train.add_argument("--train", action="store_true", help="Per-device peak per engine.")
    train.add_argument(
        "--plan", action="store_true", help="Configurations that fit --device_memory, best first."
    )
    add_flag(
        train,
        "engines",
        nargs="+",
        choices=["ddp", "fsdp2", "zero1", "zero2", "zero3"],
        help="Engines to estimate (default: all).",
    )
    add_flag(train, "device_memory", metavar="SIZE", help="Memory per device, e.g. 80GiB.")
    add_flag(train, "mixed_precision", choices=["no", "bf16", "fp16"], help="Autocast (no).")
    add_flag(train, "optimizer", help="adamw (default), adam, sgd, adagrad or rmsprop.")
    add_flag(
        train,
        "activation_checkpointing",
        action="store_const",
        const=True,
        help="Recompute each block's activations in backward (--train).",
    )
    add_flag(train, "tp_size", type=int, metavar="N",
             help="Tensor-parallel degree: the mesh's row (FSDP2 over the other ranks).")  # fmt: skip
    add_flag(train, "pp_size", type=int, metavar="N",
             help="Pipeline degree over every process (--train): the most loaded stage.")  # fmt: skip
    add_flag(train, "pp_microbatches", type=int, metavar="N",
             help="Micro-batches per batch with --pp_size (default: pp_size).")  # fmt: skip
    add_flag(train, "pp_schedule", choices=["1F1B", "GPipe"], help="With --pp_size (1F1B).")
    add_flag(
        train,
        "trace_whole",
        action="store_const",
        const=True,
        help="Trace every layer. By default a model of N identical layers is traced with 3, 4 "
        "and 5 of them and each part extended linearly to N (the row's method says so).",
    )
    add_flag(train, "margin", type=float, help="Headroom --plan keeps (default 0.1).")
    add_flag(train, "plan_file", metavar="PATH", help="--plan's output (accel_plan.yaml).")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the table (or --json); the model's shape is read only here."""
    from accel_cli import _estimate
    from accel_cli._model_shapes import load_shape

    for name in ("num_processes", "batch_size", "seq_len", "tp_size", "pp_size", "pp_microbatches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} {value}: expected at least 1.")
    if args.train or args.plan:
        from accel_cli import _estimate_train

        return _estimate_train.run(args)
    shape = load_shape(args.model_name, os.environ)
    dtypes = list(dict.fromkeys(args.dtypes))
    report = _estimate.estimate(
        shape,
        dtypes,
        args.num_processes or _estimate.DEFAULT_PROCESSES,
        args.batch_size or 1,
        args.seq_len or _estimate.DEFAULT_SEQ_LEN,
    )
    print(json.dumps(report, indent=2) if args.json else _estimate.render(report))
    return 0
