"""`accel launch --tpu` for real on XLA's CPU device (``PJRT_DEVICE=CPU``, CI's torch-xla
lane): torch-xla's launcher calls the script's --main_training_function, whose Accelerator is on
XLA and reads the launch's configuration; the script's `__main__` block does not run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from accel_testkit.launch import launch_command, worker_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None or os.environ.get("PJRT_DEVICE") != "CPU",
    reason="runs on XLA's CPU device: torch-xla installed and PJRT_DEVICE=CPU (.ci/run's lane)",
)

SCRIPT = """\
import json, sys
import torch
from accel import Accelerator

def train():
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(torch.ones(8, 4, device=accelerator.device)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    with open(sys.argv[-1], "a") as out:
        out.write(json.dumps({
            "argv": sys.argv[1:], "type": str(accelerator.distributed_type),
            "device": accelerator.device.type, "processes": accelerator.num_processes,
            "mixed_precision": accelerator.mixed_precision,
            "weight": str(next(model.parameters()).device),
        }) + "\\n")

if __name__ == "__main__":
    raise SystemExit("the TPU launcher calls train(); __main__ must not run")
"""


@pytest.mark.parametrize(
    ("flags", "mixed_precision"),
    [(["--num_processes", "1"], "no"), (["--mixed_precision", "bf16"], "bf16")],
    ids=["one-process", "every-device"],
)
def test_tpu_launch_trains_on_xla(tmp_path: Path, flags: list[str], mixed_precision: str) -> None:
    script = tmp_path / "train_xla.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.jsonl"
    cmd = launch_command(
        "--tpu", *flags, "--main_training_function", "train", script, "--lr", "1", out,
        num_processes=None, cpu=False,
    )  # fmt: skip
    done = subprocess.run(
        cmd, env=worker_env(drop=["ACCEL_*"]), capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = out.read_text().splitlines()  # one XLA device: one call
    got = json.loads(line)
    assert got["argv"] == ["--lr", "1", str(out)]
    assert got["type"] == "XLA" and got["device"] == "xla" and got["processes"] == 1
    assert got["weight"].startswith("xla") and got["mixed_precision"] == mixed_precision
