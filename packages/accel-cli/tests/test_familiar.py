"""accelerate's command-line API over accel: config dataclasses, the launch namespace, the
types the workers receive, and the CPU switch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from accel_cli.familiar import (
    BaseConfig,
    ClusterConfig,
    SageMakerConfig,
    convert_nargs_to_dict,
    launch_command_parser,
    load_config_from_file,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
    validate_launch_command,
)
from accel_cli.main import main


def _launch_json(capsys, *argv: str) -> dict:
    assert main(["launch", "--dry_run", *argv]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ACCEL_LAUNCH_CONFIG=")]
    return json.loads(line[0].split("=", 1)[1])


@pytest.fixture(autouse=True)
def _no_default_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("ACCEL_CONFIG_FILE", "ACCEL_USE_CPU", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)


def test_fsdp_flags_reach_the_worker_typed(tmp_path, capsys) -> None:
    script = tmp_path / "s.py"
    script.write_text("")
    sent = _launch_json(
        capsys, "--use_fsdp", "--fsdp_version", "2", "--fsdp_offload_params", "true",
        "--fsdp_min_num_params", "1000", str(script),
    )  # fmt: skip
    fsdp = sent["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_offload_params"] is True
    assert fsdp["fsdp_min_num_params"] == 1000


def test_quoted_file_values_reach_the_worker_typed(tmp_path, capsys) -> None:
    script, cfg = tmp_path / "s.py", tmp_path / "c.yaml"
    script.write_text("")
    cfg.write_text(
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: '3'\n"
        "  gradient_clipping: '1.5'\n  zero3_init_flag: 'true'\n"
    )
    ds = _launch_json(capsys, "--config_file", str(cfg), str(script))["deepspeed_config"]
    assert ds == {"zero_stage": 3, "gradient_clipping": 1.5, "zero3_init_flag": True}


@pytest.mark.parametrize("name", ["ACCELERATE_USE_CPU", "ACCEL_USE_CPU"])
def test_use_cpu_env_runs_multi_gpu_on_cpu(tmp_path, capsys, monkeypatch, name) -> None:
    script = tmp_path / "s.py"
    script.write_text("")
    monkeypatch.setenv(name, "1")
    sent = _launch_json(capsys, "--multi_gpu", "--num_processes", "2", str(script))
    assert sent["cpu"] is True and sent["num_processes"] == 2


def test_familiar_parser_has_accelerates_defaults() -> None:
    parser = launch_command_parser()
    args = parser.parse_args(["--multi-gpu", "--num-processes", "4", "t.py"])
    assert args.multi_gpu is True and args.num_processes == 4 and args.cpu is False
    assert args.fsdp_version == "1" and args.training_script == "t.py"
    assert args.nondefault == {"multi_gpu", "num_processes"}
    help_text = parser.format_help()
    assert "--multi-gpu" not in help_text and help_text.count("--num-processes") == 1


def test_validate_fills_from_the_file_and_keeps_flags(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "distributed_type: FSDP\ndebug: true\nnum_processes: 4\n"
        "fsdp_config:\n  fsdp_sync_module_states: false\n"
    )
    args = launch_command_parser().parse_args(
        ["--num_processes", "2", "--config_file", str(cfg), "t.py"]
    )
    args, defaults, _ = validate_launch_command(args)
    assert args.debug is True and args.num_processes == 2 and args.use_fsdp is True
    assert args.fsdp_sync_module_states is False and isinstance(defaults, ClusterConfig)


def test_simple_launcher_env_sets_kmp_for_cpu(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("KMP_AFFINITY", raising=False)
    args = launch_command_parser().parse_args(["--cpu", "t.py", "--x", "1"])
    cmd, env = prepare_simple_launcher_cmd_env(args)
    assert cmd[-3:] == ["t.py", "--x", "1"] and env["KMP_BLOCKTIME"] == "1"
    _, env = prepare_simple_launcher_cmd_env(launch_command_parser().parse_args(["t.py"]))
    assert "KMP_AFFINITY" not in env


# accelerate's tests/test_configs/0_28_0_mpi.yaml (without the ipex_config that 1.15 refuses)
MPI_CONFIG = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
machine_rank: 0
main_process_ip: 127.0.0.1
main_process_port: 29500
main_training_function: main
mixed_precision: 'no'
mpirun_config:
  mpirun_ccl: '1'
  mpirun_hostfile: /home/user/hostfile
num_machines: 4
num_processes: 16
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


@pytest.mark.parametrize(
    ("version", "launcher"),
    [
        (b"Intel(R) MPI Library", ["mpirun", "-f", "/home/user/hostfile", "-ppn", "4", "-n", "16"]),
        (b"mpirun (Open MPI) 4.1.2", ["mpirun", "--hostfile", "/home/user/hostfile",
                                      "--npernode", "4", "-n", "16"]),
    ],
)  # fmt: skip
def test_mpirun_command_is_accelerates(tmp_path, version, launcher) -> None:
    """accelerate's test_mpi_multicpu_config_cmd: Hydra's mpirun (Intel MPI, MPICH, MVAPICH)
    passes the whole environment by itself, so the command is accelerate's word for word;
    Open MPI's exports the rendezvous and the launch configuration by name."""
    cfg = tmp_path / "mpi.yaml"
    cfg.write_text(MPI_CONFIG)
    args = launch_command_parser().parse_args(["--config_file", str(cfg), "train.py", "--cpu"])
    args, _, _ = validate_launch_command(args)
    cmd, env = prepare_simple_launcher_cmd_env(
        args, which=lambda name: f"/usr/bin/{name}", mpi_version=lambda path: version
    )
    program = [sys.executable, "train.py", "--cpu"]
    if version.startswith(b"Intel"):
        assert cmd == [*launcher, *program]
    else:
        exported = ["ACCEL_LAUNCH_CONFIG", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"]
        assert cmd == [*launcher, *(w for name in exported for w in ("-x", name)), *program]
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29500"
    assert json.loads(env["ACCEL_LAUNCH_CONFIG"])["num_processes"] == 16


def test_multi_gpu_env_picks_a_port_for_zero() -> None:
    args = argparse.Namespace(num_processes=1, main_process_port=0, training_script="t.py")
    prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"


def test_config_dataclasses_round_trip(tmp_path) -> None:
    config = ClusterConfig(
        compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPU",
        mixed_precision="bf16", debug=False, use_cpu=False, num_processes=2,
        fsdp_config={"fsdp_version": 2},
    )  # fmt: skip
    config.to_yaml_file(tmp_path / "c.yaml")
    loaded = load_config_from_file(str(tmp_path / "c.yaml"))
    assert isinstance(loaded, ClusterConfig) and loaded.to_dict() == config.to_dict()
    config.to_json_file(tmp_path / "c.json")
    assert ClusterConfig.from_json_file(tmp_path / "c.json").num_processes == 2
    base = BaseConfig("LOCAL_MACHINE", "NO", "fp16", False, False)
    assert base.distributed_type == "NO" and base.to_dict()["mixed_precision"] == "fp16"
    sm = SageMakerConfig(
        compute_environment="AMAZON_SAGEMAKER", distributed_type="NO", mixed_precision="no",
        use_cpu=False, debug=False, ec2_instance_type="ml.p3.2xlarge", iam_role_name="r",
    )  # fmt: skip
    sm.to_yaml_file(tmp_path / "sm.yaml")
    assert isinstance(load_config_from_file(str(tmp_path / "sm.yaml")), SageMakerConfig)
    (tmp_path / "bad.yaml").write_text("distributed_type: NO\nnum_proceses: 2\n")
    with pytest.raises(ValueError, match="num_processes"):
        load_config_from_file(str(tmp_path / "bad.yaml"))


def test_to_fsdp2_errors_have_accelerates_types(tmp_path) -> None:
    from accel_cli.familiar import to_fsdp2_command

    def ns(**kw):
        return argparse.Namespace(**{"output_file": None, "overwrite": False, **kw})

    with pytest.raises(FileNotFoundError):
        to_fsdp2_command(ns(config_file=str(tmp_path / "missing.yaml")))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n")
    with pytest.raises(ValueError):
        to_fsdp2_command(ns(config_file=str(cfg)))
    with pytest.raises(FileExistsError):
        to_fsdp2_command(ns(config_file=str(cfg), output_file=str(cfg)))


def test_tpu_config_prints_the_gcloud_command(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no default config file
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    from accel_cli.familiar import tpu_command_launcher, tpu_command_parser

    args = tpu_command_parser().parse_args(
        ["--command", "ls", "--tpu_zone", "z", "--tpu_name", "t", "--install_accelerate", "--debug"]
    )
    tpu_command_launcher(args)
    assert "ssh t --zone z --command cd /usr/share; pip install accel -U; ls --worker all" in (
        capsys.readouterr().out
    )
    from accel_cli.main import main  # and as a subcommand of `accel`, as of `accelerate`

    argv = ["tpu-config", "--command", "ls", "--tpu_zone", "z", "--tpu_name", "t", "--debug"]
    assert main(argv) == 0
    assert "gcloud compute tpus tpu-vm ssh t --zone z --command cd /usr/share; ls" in (
        capsys.readouterr().out
    )
    assert main(["tpu-config", "--tpu_zone", "z", "--tpu_name", "t", "--debug"]) == 2


def test_convert_nargs_to_dict_infers_types() -> None:
    out = convert_nargs_to_dict(["--a", "x", "--b", "False", "--c", "3", "--d", "0.5"])
    assert out == {"a": "x", "b": False, "c": 3, "d": 0.5}
    with pytest.raises(ValueError, match="no value"):
        convert_nargs_to_dict(["--flag", "--a", "x"])


def test_familiar_launch_raises_when_the_script_fails(tmp_path) -> None:
    from accel_cli.familiar import launch_command

    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError):
        launch_command(launch_command_parser().parse_args(["--cpu", str(script)]))
