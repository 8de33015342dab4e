"""--preflight where it cannot run: an explicit one is an error that names the flag, the
launcher and the fix; the default one (several machines) says in one line that it did not
run. The preflight's report prints the fatal problems first."""

from __future__ import annotations

import argparse

import pytest

from accel_cli._commands.launch import _network_env
from accel_cli._launch_config import LaunchConfig
from accel_cli._preflight import Outcome, Problem, report
from accel_cli.main import main


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "s.py"
    path.write_text("")
    return str(path)


def _refused(capsys, *argv: str) -> str:
    assert main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert "error: --preflight cannot run under" in err, err
    assert "Drop --preflight" in err, err
    return err


def test_one_process_run_refuses_an_explicit_preflight(script, capsys):
    err = _refused(capsys, "--preflight", "on", "--dry_run", script)
    assert "a one-process run" in err and "--num_processes N" in err


def test_mpirun_refuses_an_explicit_preflight(script, tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    err = _refused(capsys, "--preflight", "--cpu", "--num_processes", "2",
                   "--mpirun_hostfile", str(hosts), "--dry_run", script)  # fmt: skip
    assert "mpirun (mpirun_hostfile)" in err and "leave out mpirun_hostfile" in err


def test_deepspeed_runner_refuses_an_explicit_preflight(script, tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\nworker-2 slots=2\n")
    err = _refused(capsys, "--preflight", "strict", "--use_deepspeed", "--num_machines", "2",
                   "--num_processes", "4", "--main_process_ip", "10.1.2.3",
                   "--deepspeed_hostfile", str(hostfile), "--dry_run", script)  # fmt: skip
    assert "DeepSpeed's multi-node runner" in err
    assert "deepspeed_multinode_launcher: standard" in err


def test_tpu_refuses_an_explicit_preflight(script, capsys):
    err = _refused(capsys, "--tpu", "--preflight", "--main_training_function", "main",
                   "--dry_run", script)  # fmt: skip
    assert "torch-xla's launcher (--tpu)" in err


def test_the_default_preflight_says_in_one_line_that_it_does_not_run(capsys):
    config = LaunchConfig(
        num_processes=4, num_machines=2, cpu=True, main_process_ip="10.0.0.1",
        main_process_port=29500, mpirun_hostfile="hosts",
    )  # fmt: skip
    args = argparse.Namespace(preflight=None, dry_run=False)
    assert _network_env(config, args) == ({}, None, False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "preflight: not run under mpirun" in lines[0], lines
    # --no_preflight, or a dry run, says nothing
    for given in (argparse.Namespace(preflight="off", dry_run=False),
                  argparse.Namespace(preflight=None, dry_run=True)):  # fmt: skip
        assert _network_env(config, given) == ({}, None, False)
        assert capsys.readouterr().err == ""


def test_report_prints_fatal_problems_first() -> None:
    outcome = Outcome(
        (Problem("host 1", "settings differ", fatal=False), Problem("host 0", "port in use")),
        None,
        None,
    )
    lines: list[str] = []
    report(outcome, lines.append)
    assert lines == [
        "1 problem(s); no worker was started:",
        "  host 0: port in use",
        "warning: host 1: settings differ",
    ]
