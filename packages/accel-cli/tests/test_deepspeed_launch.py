"""`accel launch` for DeepSpeed: the flags and `deepspeed_config` keys reach the workers, and
a hostfile on several machines builds DeepSpeed's runner command (checked with --dry_run;
there are no remote hosts here)."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys

import pytest

from accel_cli.main import main


def _dry_run(capsys, *argv: str) -> tuple[list[str], dict[str, str]]:
    assert main(["launch", "--dry_run", *argv]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    return shlex.split(lines[0]), dict(line.split("=", 1) for line in lines[1:])


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(
        "import json, os, sys\nprint(os.environ['ACCEL_LAUNCH_CONFIG'], sys.argv[1:])\n"
    )
    return path


def test_flags_reach_the_workers(script, capsys):
    cmd, env = _dry_run(
        capsys, "--use_deepspeed", "--zero_stage", "3", "--zero3_init_flag", "true",
        "--zero3_save_16bit_model", "true", "--gradient_clipping", "0.5",
        "--offload_optimizer_device", "cpu", "--num_processes", "2", "--cpu", str(script),
    )  # fmt: skip
    assert cmd[1:3] == ["-m", "torch.distributed.run"]  # one machine: torchrun, as always
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["distributed_type"] == "DEEPSPEED"
    assert launched["deepspeed_config"] == {
        "zero_stage": 3, "zero3_init_flag": True, "zero3_save_16bit_model": True,
        "gradient_clipping": 0.5, "offload_optimizer_device": "cpu",
    }  # fmt: skip


@pytest.mark.needs("accel_parallel")
def test_the_config_file_section_reaches_the_workers(script, tmp_path, capsys):
    cfg = tmp_path / "ds.yaml"
    cfg.write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\nmixed_precision: bf16\n"
        "deepspeed_config:\n  zero_stage: 2\n  gradient_accumulation_steps: 4\n"
        "  deepspeed_config_file: ds.json\n"
    )
    _, env = _dry_run(capsys, "--config_file", str(cfg), "--zero_stage", "1", str(script))
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["distributed_type"] == "DEEPSPEED" and launched["mixed_precision"] == "bf16"
    assert launched["deepspeed_config"] == {
        "zero_stage": 1,
        "gradient_accumulation_steps": 4,
        "deepspeed_config_file": "ds.json",
    }  # fmt: skip  (the flag beats the file's key)
    from accel_parallel import DeepSpeedPlugin

    plugin = DeepSpeedPlugin.from_launch_config({"zero_stage": 1, "zero3_init_flag": "false"})
    assert plugin.zero_stage == 1 and plugin.zero3_init_flag is False


def test_a_hostfile_on_several_machines_builds_the_deepspeed_runner(script, tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\nworker-2 slots=2\n")
    common = [
        "--use_deepspeed", "--zero_stage", "2", "--num_machines", "2", "--num_processes", "4",
        "--main_process_ip", "10.1.2.3", "--main_process_port", "29600",
        "--deepspeed_hostfile", str(hostfile),
    ]  # fmt: skip
    cmd, env = _dry_run(capsys, *common, str(script), "--lr", "3")
    assert cmd[:3] == [sys.executable, "-m", "deepspeed.launcher.runner"]
    assert cmd[3:18] == [
        "--hostfile", str(hostfile), "--launcher", "pdsh", "--num_nodes", "2", "--num_gpus", "2",
        "--master_addr", "10.1.2.3", "--master_port", "29600", "--no_local_rank",
        "--module", "accel_cli._deepspeed_entry",
    ]  # fmt: skip
    encoded, mode, target, *args = cmd[18:]
    assert (mode, target, args) == ("script", str(script), ["--lr", "3"])
    carried = json.loads(base64.urlsafe_b64decode(encoded))
    assert carried == json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert carried["deepspeed_config"]["deepspeed_hostfile"] == str(hostfile)
    # the filters and the launcher are DeepSpeed's
    cmd, _ = _dry_run(capsys, *common, "--deepspeed_inclusion_filter", "worker-1:0,1",
                      "--deepspeed_multinode_launcher", "openmpi", str(script))  # fmt: skip
    assert cmd[cmd.index("--launcher") + 1] == "openmpi"
    assert cmd[cmd.index("--include") + 1] == "worker-1:0,1" and "--num_gpus" not in cmd
    # 'standard': torchrun on each machine, no runner
    cmd, _ = _dry_run(capsys, *common, "--deepspeed_multinode_launcher", "standard", str(script))
    assert cmd[1:3] == ["-m", "torch.distributed.run"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--zero_stage", "2"], "add --use_deepspeed"),
        (["--gradient_clipping", "1.0"], "add --use_deepspeed"),
        (["--use_deepspeed", "--use_fsdp"], "contradict"),
        (["--use_deepspeed", "--deepspeed_hostfile", "HOSTFILE"], "num_machines=1"),
        (["--use_deepspeed", "--num_machines", "2", "--num_processes", "2",
          "--main_process_ip", "10.0.0.1"], "needs --deepspeed_hostfile"),
        (["--use_deepspeed", "--num_machines", "2", "--num_processes", "2", "--main_process_ip",
          "10.0.0.1", "--deepspeed_hostfile", "missing"], "does not exist"),
        (["--use_deepspeed", "--num_machines", "2", "--num_processes", "2", "--main_process_ip",
          "10.0.0.1", "--deepspeed_hostfile", "HOSTFILE", "--deepspeed_multinode_launcher",
          "ssh"], "accepted ['pdsh', 'standard'"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused(argv, expected, script, tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=1\n")
    argv = [str(hostfile) if a == "HOSTFILE" else a for a in argv]
    assert main(["launch", "--dry_run", *argv, str(script)]) == 2
    assert expected in capsys.readouterr().err


def test_the_entry_gives_the_worker_its_configuration(script):
    config = {"version": 1, "distributed_type": "DEEPSPEED"}
    encoded = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()
    done = subprocess.run(
        [sys.executable, "-m", "accel_cli._deepspeed_entry", encoded, "script", str(script), "a"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    printed, argv = done.stdout.rsplit(" ", 1)
    assert json.loads(printed) == config and argv.strip() == "['a']"
