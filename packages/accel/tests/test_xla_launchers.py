"""`notebook_launcher` and accelerate's `tpu_launcher` on XLA's CPU device (``PJRT_DEVICE=CPU``):
the function runs through torch-xla's launcher, its Accelerator on XLA with the launcher's mixed
precision. Each launch in a fresh interpreter: torch-xla refuses to start workers once its
runtime is up in the caller. And the TPU names at accelerate's paths that stay refused."""

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

def train(path=None):
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(torch.nn.Linear(4, 1), None)
    with open(path or sys.argv[-1], "a") as out:
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


TPU_LAUNCHER = """\
import sys
from accel.commands.launch import launch_command_parser, tpu_launcher

if __name__ == "__main__":  # torch-xla's spawned workers import this file again
    argv = ["--tpu", "--main_training_function", "train", "--mixed_precision", "bf16"]
    tpu_launcher(launch_command_parser().parse_args([*argv, *sys.argv[1:]]))
"""


@skip_without_xla_cpu
def test_accelerates_tpu_launcher_runs_the_script_on_xla(tmp_path: Path) -> None:
    script = tmp_path / "train_script.py"
    script.write_text(
        NOTEBOOK.split("notebook_launcher(train")[0]
        + "if __name__ == '__main__':\n    raise SystemExit('__main__ must not run')\n"
    )
    launcher = tmp_path / "launcher.py"
    launcher.write_text(TPU_LAUNCHER)
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, str(launcher), str(script), str(out)],
        env=worker_env(drop=["ACCEL_*"]), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = out.read_text().splitlines()
    assert json.loads(line)["type"] == "XLA" and json.loads(line)["mixed_precision"] == "bf16"


def test_accelerates_tpu_helpers_at_their_paths() -> None:
    from argparse import Namespace

    from accel.commands.launch import prepare_tpu, tpu_launcher, tpu_pod_launcher
    from accel.utils import install_xla
    from accel.utils import prepare_tpu as at_utils

    assert at_utils is prepare_tpu
    args = Namespace(mixed_precision="no", debug=True, tpu_vm=["w0"], tpu_name="pod")
    args, env = prepare_tpu(args, {}, pod=True)
    assert env == {"ACCELERATE_DEBUG_MODE": "true"} and (args.vm, args.tpu) == (["w0"], "pod")
    with pytest.raises(ValueError, match="--no_python"):
        tpu_launcher(Namespace(no_python=True))
    with pytest.raises(NotImplementedError, match="accel launch --tpu SCRIPT"):
        tpu_pod_launcher(args)
    with pytest.raises(NotImplementedError, match="from PyPI"):
        install_xla()


def test_num_processes_as_torch_xla_accepts_it() -> None:
    assert xla_nprocs(None, {}) == (None, {}) and xla_nprocs(1, {"PJRT_DEVICE": "TPU"}) == (1, {})
    assert xla_nprocs(4, {"PJRT_DEVICE": "CPU"}) == (None, {"CPU_NUM_DEVICES": "4"})
    with pytest.raises(ValueError, match="num_processes=2"):
        xla_nprocs(2, {"PJRT_DEVICE": "NEURON"})
