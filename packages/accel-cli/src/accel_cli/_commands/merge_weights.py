"""`accel merge-weights`: a sharded FSDP2 model save -> one weights file (accel-parallel)."""

from __future__ import annotations

import argparse
import shutil

from accel_cli._commands._common import say

NAME = "merge-weights"
HELP = "Merge a sharded FSDP2 model save into plain safetensors weights."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help=HELP,
        description="CHECKPOINT_DIR is a model's sharded folder written by save_state under "
        "FSDP2 (CKPT/pytorch_model_fsdp_0), or the checkpoint folder holding exactly one; "
        "OUTPUT is the folder to write model.safetensors (pytorch_model.bin with "
        "--unsafe_serialization) into. Either may be an object-store URL (s3://..., with "
        "accel[s3]). Runs in one process, without a process group.",
    )
    p.add_argument("checkpoint_directory", metavar="CHECKPOINT_DIR")
    p.add_argument("output_path", metavar="OUTPUT")
    p.add_argument(
        "--unsafe_serialization", action="store_true", help="Write pytorch_model.bin instead."
    )
    p.add_argument(
        "--remove_checkpoint_dir", action="store_true", help="Delete CHECKPOINT_DIR afterwards."
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Merge through accel-parallel (imported here, with an install hint when missing)."""
    try:
        from accel_parallel import merge_fsdp_weights
    except ImportError as err:
        raise SystemExit(
            f"accel merge-weights needs accel-parallel ({err}): pip install accel-parallel"
        ) from err

    source, output = args.checkpoint_directory, args.output_path
    if "://" not in source + output:
        out = merge_fsdp_weights(
            source, output, safe_serialization=not args.unsafe_serialization,
            remove_checkpoint_dir=args.remove_checkpoint_dir,
        )  # fmt: skip
        say(f"wrote the merged weights to {out}")
        return 0
    try:  # a store URL on either side: fetched, merged locally, published
        from accel_bigmodel import stores
    except ImportError as err:
        raise SystemExit(
            f"accel merge-weights with a URL needs accel-bigmodel[s3] ({err}): "
            f"pip install 'accel-bigmodel[s3]'"
        ) from err
    with stores.fetched(source) as local_source, stores.published(output) as local_output:
        merge_fsdp_weights(
            local_source, local_output, safe_serialization=not args.unsafe_serialization
        )
    if args.remove_checkpoint_dir:
        if stores.is_url(source):
            stores.remove(source)
        else:
            shutil.rmtree(source)
    say(f"wrote the merged weights to {output}")
    return 0
