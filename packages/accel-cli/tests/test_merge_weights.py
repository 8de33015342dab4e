"""`accel merge-weights` on accelerate's sharded folder, with the umbrella `accel` unimportable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

WITHOUT_ACCEL = """
import sys
sys.modules["accel"] = None  # `import accel` fails: the command must not need the umbrella
from accel_cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.needs("accel_parallel")
def test_merge_weights_needs_only_accel_parallel(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    weights = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4)}
    folder = tmp_path / "ckpt" / "pytorch_model_fsdp_0"  # as save_state writes it
    dcp.save({"model": weights}, checkpoint_id=folder, no_dist=True)
    out = tmp_path / "merged"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ACCEL, "merge-weights", str(folder), str(out),
         "--unsafe_serialization"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    merged = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert merged.keys() == weights.keys()
    assert all(torch.equal(merged[k], weights[k]) for k in weights)


@pytest.mark.needs("accel_parallel", "s3fs", "moto")
def test_merge_weights_reads_and_writes_store_urls(tmp_path: Path, s3: str) -> None:
    """The sharded folder in a store, the merged weights into a store (a real S3 server)."""
    import os

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load as load_safetensors

    from accel_bigmodel import stores

    weights = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4)}
    folder = tmp_path / "ckpt" / "pytorch_model_fsdp_0"
    dcp.save({"model": weights}, checkpoint_id=folder, no_dist=True)
    stores.upload(tmp_path / "ckpt", f"{s3}/ckpt")
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ACCEL, "merge-weights", f"{s3}/ckpt/pytorch_model_fsdp_0",
         f"{s3}/merged", "--remove_checkpoint_dir"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    merged = load_safetensors(stores.read_bytes(f"{s3}/merged/model.safetensors"))
    assert merged.keys() == weights.keys()
    assert all(torch.equal(merged[k], weights[k]) for k in weights)
    assert stores.files_under(f"{s3}/ckpt/pytorch_model_fsdp_0") == []  # removed as asked
    assert not list(tmp_path.glob("s3:*"))
    from accel_parallel import merge_fsdp_weights

    with pytest.raises(ValueError, match=r"'s3://.*' is a URL: run `accel merge-weights"):
        merge_fsdp_weights(folder, f"{s3}/merged2")
