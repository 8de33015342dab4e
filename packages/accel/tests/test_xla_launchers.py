"""`notebook_launcher` on XLA's CPU device (``PJRT_DEVICE=CPU``): the function runs through
torch-xla's launcher, its Accelerator on XLA with the launcher's mixed precision. Each launch in
a fresh interpreter: torch-xla refuses to start workers once its runtime is up in the caller."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _xla_cases import skip_without_xla_cpu

from accel._xla_launcher import xla_nprocs
from accel_testkit.launch import worker_env

NOTEBOOK = """\
import json, sys
import torch
from accel import Accelerator, notebook_launcher

def train(path):
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(torch.nn.Linear(4, 1), None)
    with open(path, "a") as out:
        out.write(json.dumps({
            "type": str(accelerator.distributed_type), "device": accelerator.device.type,
            "weight": next(model.parameters()).device.type,
            "mixed_precision": accelerator.mixed_precision,
        }) + "\\n")

notebook_launcher(train, args=(sys.argv[1],), num_processes={num_processes}, mixed_precision="bf16")
"""


@skip_without_xla_cpu
@pytest.mark.parametrize("num_processes", [1, None], ids=["one-process", "every-device"])
def test_notebook_launcher_runs_the_function_on_xla(tmp_path: Path, num_processes) -> None:
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK.replace("{num_processes}", str(num_processes)))
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=worker_env(drop=["ACCEL_*"]), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = out.read_text().splitlines()
    assert json.loads(line) == {
        "type": "XLA", "device": "xla", "weight": "xla", "mixed_precision": "bf16"
    }  # fmt: skip


def test_num_processes_as_torch_xla_accepts_it() -> None:
    assert xla_nprocs(None, {}) == (None, {}) and xla_nprocs(1, {"PJRT_DEVICE": "TPU"}) == (1, {})
    assert xla_nprocs(4, {"PJRT_DEVICE": "CPU"}) == (None, {"CPU_NUM_DEVICES": "4"})
    with pytest.raises(ValueError, match="num_processes=2"):
        xla_nprocs(2, {"PJRT_DEVICE": "NEURON"})
