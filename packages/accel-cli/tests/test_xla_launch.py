"""`accel launch --tpu` by its printed command (--dry_run), its refusals, and how the entry
turns --num_processes into torch-xla's process count. The real launch on XLA's CPU device is
integration-tests/test_xla_launch.py."""

from __future__ import annotations

import shlex
import sys

import pytest

from accel_cli._xla_entry import nprocs
from accel_cli.main import main


@pytest.fixture(autouse=True)
def _no_default_config(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("ACCEL_CONFIG_FILE", "ACCELERATE_USE_CPU", "ACCEL_USE_CPU", "PJRT_DEVICE"):
        monkeypatch.delenv(name, raising=False)


def _script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("def main():\n    pass\n")
    return script


def _dry_run(capsys, *argv: str) -> tuple[list[str], dict[str, str]]:
    assert main(["launch", "--dry_run", *argv]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    return shlex.split(lines[0]), dict(line.split("=", 1) for line in lines[1:])


def test_tpu_runs_the_entry_over_torch_xla(tmp_path, capsys):
    script = _script(tmp_path)
    cmd, env = _dry_run(capsys, "--tpu", str(script), "--lr", "1")
    entry = [sys.executable, "-m", "accel_cli._xla_entry", "--main_training_function", "main"]
    assert cmd == [*entry, str(script), "--lr", "1"]  # every device of the host
    assert '"mixed_precision": "no"' in env["ACCEL_LAUNCH_CONFIG"]
    argv = ["--tpu", "--no_tpu_cluster", "--num_processes", "1", "--mixed_precision", "bf16"]
    cmd, env = _dry_run(capsys, *argv, "--main_training_function", "train", "-m", "pkg.mod")
    assert cmd[3:] == ["--num_processes", "1", "--main_training_function", "train", "-m", "pkg.mod"]
    assert '"mixed_precision": "bf16"' in env["ACCEL_LAUNCH_CONFIG"]


def test_a_config_file_of_distributed_type_xla_launches_on_xla(tmp_path, capsys, monkeypatch):
    script = _script(tmp_path)
    cfg = tmp_path / "xla.yaml"  # what `accelerate config` writes for a TPU VM
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\ndowncast_bf16: 'no'\n"
        "machine_rank: 0\nmain_training_function: train\nmixed_precision: bf16\n"
        "num_machines: 1\nnum_processes: 8\nrdzv_backend: static\nsame_network: true\n"
        "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n"
    )
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    cmd, env = _dry_run(capsys, "--config_file", str(cfg), str(script))
    assert cmd[2:8] == [
        "accel_cli._xla_entry", "--num_processes", "8", "--main_training_function", "train",
        str(script),
    ]  # fmt: skip
    assert env["PJRT_DEVICE"] == "CPU" and '"mixed_precision": "bf16"' in env["ACCEL_LAUNCH_CONFIG"]
    cmd, _ = _dry_run(capsys, "--config_file", str(cfg), "--cpu", str(script))
    assert "torch.distributed.run" in cmd  # --cpu asks for another kind of run, as in accelerate


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tpu", "--tpu_cluster"], "xla_dist, which torch-xla 2.1 removed"),
        (["--tpu_cluster"], "accel tpu-config"),
        (["--tpu", "--vm", "worker-1"], "--vm: the TPU pod launcher"),
        (["--tpu", "--tpu_use_sudo"], "--tpu_use_sudo: the TPU pod launcher"),
        (["--tpu", "--mixed_precision", "fp16"], "use --mixed_precision bf16"),
        (["--tpu", "--multi_gpu"], "--tpu and --multi_gpu contradict"),
        (["--tpu", "--use_fsdp"], "--tpu and --use_fsdp contradict"),
        (["--tpu", "--no_python"], "--no_python cannot be used with --tpu"),
        (["--tpu", "--num_machines", "2", "--main_process_ip", "10.0.0.1"], "every worker"),
        (["--tpu", "--num_processes", "0"], "--num_processes 0"),
        (["--tpu", "--downcast_bf16"], "no longer reads"),
        (["--tpu", "--dynamo_backend", "torhchxla_trace_once"], "openxla"),
    ],
)
def test_what_torch_xla_cannot_do_is_refused(argv, expected, tmp_path, capsys):
    assert main(["launch", "--dry_run", *argv, str(_script(tmp_path))]) == 2
    assert expected in capsys.readouterr().err


def test_a_pod_config_file_is_refused_naming_the_replacement(tmp_path, capsys):
    cfg = tmp_path / "pod.yaml"
    cfg.write_text("distributed_type: XLA\ntpu_use_cluster: true\ntpu_name: pod\n")
    assert main(["launch", "--dry_run", "--config_file", str(cfg), str(_script(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "tpu_use_cluster: true" in err and "accel launch --tpu SCRIPT" in err


def test_num_processes_as_torch_xla_accepts_it():
    assert nprocs(None, {}) is None and nprocs(1, {"PJRT_DEVICE": "TPU"}) == 1
    environ = {"PJRT_DEVICE": "CPU"}
    assert nprocs(4, environ) is None and environ["CPU_NUM_DEVICES"] == "4"
    with pytest.raises(SystemExit, match="NEURON_NUM_DEVICES"):
        nprocs(2, {"PJRT_DEVICE": "NEURON"})
