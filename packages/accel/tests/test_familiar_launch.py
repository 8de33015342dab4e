"""What accelerate's launch tests patch and read exists at accelerate's paths and takes effect."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest.mock import patch

from accel.commands.estimate import estimate_command_parser
from accel.commands.launch import _validate_launch_command, launch_command_parser
from accel.utils.launch import prepare_simple_launcher_cmd_env


def test_mpirun_found_through_the_names_accelerates_tests_patch(tmp_path: Path) -> None:
    # accelerate's tests/test_cli.py::test_mpi_multicpu_config_cmd: mpirun taken for Intel MPI
    # by patching `which` and `subprocess.check_output` of accelerate.utils.launch.
    config = tmp_path / "0_28_0_mpi.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nmachine_rank: 0\n"
        "main_process_ip: 192.168.1.1\nmain_process_port: 29500\nmain_training_function: main\n"
        "mixed_precision: fp16\nmpirun_config:\n  mpirun_ccl: '1'\n"
        "  mpirun_hostfile: /home/user/hostfile\nnum_machines: 4\nnum_processes: 16\n"
        "rdzv_backend: static\nsame_network: true\nuse_cpu: true\n"
    )
    script = tmp_path / "script.py"
    script.write_text("")
    with patch.object(sys, "argv", ["accelerate", str(script), "--cpu"]):
        args = launch_command_parser().parse_args()
    args.config_file = str(config)
    args, _, _ = _validate_launch_command(args)
    with (
        patch("accel.utils.launch.which", return_value=True),
        patch("accel.utils.launch.subprocess.check_output", return_value=b"Intel MPI"),
    ):
        cmd, _ = prepare_simple_launcher_cmd_env(args)
    assert cmd[:7] == ["mpirun", "-f", "/home/user/hostfile", "-ppn", "4", "-n", "16"]
    assert cmd[7:] == [sys.executable, str(script), "--cpu"]  # accelerate's 3 words
    with (
        patch("accel.utils.launch.which", return_value=True),
        patch("accel.utils.launch.subprocess.check_output", return_value=b"Open MPI 4.1"),
    ):
        cmd, _ = prepare_simple_launcher_cmd_env(args)
    assert cmd[:3] == ["mpirun", "--hostfile", "/home/user/hostfile"]


def test_estimate_parser_names_the_model_as_accelerate_does() -> None:
    args = estimate_command_parser().parse_args(["some/model", "--dtypes", "float32"])
    assert args.model_name == "some/model" and args.dtypes == ["float32"]
