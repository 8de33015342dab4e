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
