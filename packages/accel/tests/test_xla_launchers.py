"""`notebook_launcher` and accelerate's `tpu_launcher` on XLA's CPU device (``PJRT_DEVICE=CPU``):
the function runs through torch-xla's launcher, its Accelerator on XLA with the launcher's mixed
precision. Each launch in a fresh interpreter: torch-xla refuses to start workers once its
runtime is up in the caller. Over 2 devices of one process torch-xla runs a thread per device,
each with its own Accelerator. And the TPU names at accelerate's paths that stay refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _xla_cases import skip_without_xla_cpu

from accel._xla_launcher import xla_nprocs
from accel_state.testing import free_port
from accel_testkit.launch import worker_env
from accel_testkit.tolerance import assert_same_forward, float32_error

NOTEBOOK = """\
import json, sys
import torch
from accel import Accelerator, notebook_launcher

def train(path=None):
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(torch.nn.Linear(4, 1), None)
    with open(path or sys.argv[-1], "a") as out:
        out.write(json.dumps({
            "type": str(accelerator.distributed_type), "device": str(accelerator.device),
            "weight": str(next(model.parameters()).device), "process": accelerator.process_index,
            "mixed_precision": accelerator.mixed_precision,
        }) + "\\n")

notebook_launcher(train, args=(sys.argv[1],), num_processes={num_processes}, mixed_precision="bf16")
"""


@skip_without_xla_cpu
@pytest.mark.parametrize(
    "num_processes", [1, None, 2], ids=["one-process", "every-device", "two-device-threads"]
)
def test_notebook_launcher_runs_the_function_on_xla(tmp_path: Path, num_processes) -> None:
    """num_processes=2 on XLA's CPU device: 2 devices in one process, torch-xla runs the
    function in a thread per device, each its own replica (no collective: they hang there)."""
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK.replace("{num_processes}", str(num_processes)))
    out = tmp_path / "out.jsonl"
    env = worker_env(drop=["ACCEL_*"], MASTER_PORT=str(free_port()))
    done = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = out.read_text().splitlines()
    seen = sorted((json.loads(line) for line in lines), key=lambda r: r["process"])
    assert seen == [
        {"type": "XLA", "device": f"xla:{i}", "weight": f"xla:{i}", "process": i,
         "mixed_precision": "bf16"}
        for i in range(num_processes or 1)
    ]  # fmt: skip


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


REPLICA_THREADS = """\
import json, sys, threading
from pathlib import Path
import torch

both_made = threading.Barrier(2, timeout=300)  # Python's, between the threads: no XLA collective

def replica(index, folder):
    import torch.distributed as dist
    from accel import Accelerator, AcceleratorState, GradientState, PartialState

    accelerator = Accelerator(gradient_accumulation_steps=index + 1)
    model = torch.nn.Linear(4, 2)
    x = torch.arange(12.0).reshape(3, 4)
    want = model(x)
    model = accelerator.prepare(model)
    got = model(x.to(accelerator.device))
    both_made.wait()  # each thread reads its state after the other made its own
    Path(folder, f"{index}.json").write_text(json.dumps({
        "device": str(accelerator.device), "weight": str(next(model.parameters()).device),
        "output": str(got.device), "type": str(accelerator.distributed_type),
        "process_index": accelerator.process_index,
        "local_process_index": accelerator.local_process_index,
        "num_processes": accelerator.num_processes, "main": accelerator.is_main_process,
        "read_anew": [str(PartialState().device), AcceleratorState().process_index,
                      GradientState().num_steps],
        "group": [dist.get_backend(), dist.get_world_size()],
        "got": got.detach().cpu().tolist(), "want": want.detach().tolist(),
    }))

if __name__ == "__main__":
    import torch_xla.distributed.xla_multiprocessing as xmp
    xmp.spawn(replica, args=(sys.argv[1],))
"""


@skip_without_xla_cpu
def test_each_replica_thread_has_its_own_accelerator(tmp_path: Path) -> None:
    """torch-xla runs one thread per device of a process (xmp.spawn over 2 CPU devices: 2
    threads, one process): each thread's Accelerator is its replica's, its model on its
    device. Collectives across the threads hang on XLA's CPU device, so none runs."""
    script = tmp_path / "replicas.py"
    script.write_text(REPLICA_THREADS)
    env = worker_env(drop=["ACCEL_*"], CPU_NUM_DEVICES="2", MASTER_PORT=str(free_port()))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for index in (0, 1):
        seen = json.loads((tmp_path / f"{index}.json").read_text())
        device = f"xla:{index}"
        assert (seen["device"], seen["weight"], seen["output"]) == (device, device, device)
        assert seen["type"] == "XLA" and seen["num_processes"] == 2
        assert seen["process_index"] == seen["local_process_index"] == index
        assert seen["main"] == (index == 0)
        assert seen["read_anew"] == [device, index, index + 1]  # its own, not the other's
        assert seen["group"] == ["xla", 2]  # the process's one group, made by the first thread
        # one layer, 4 terms a sum: XLA's order of the sum against eager's
        got, want = torch.tensor(seen["got"]), torch.tensor(seen["want"])
        assert_same_forward(got, want, float32_error(1, 4))


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
