"""`accel launch --step_metrics` hands `step_metrics: true` to the workers in the launch
configuration (the Accelerator reads it as `log_step_metrics=True`)."""

from __future__ import annotations

import json

import pytest

from accel_cli.main import main


def _launched(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["launch", "--dry_run", *argv]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    env = dict(line.split("=", 1) for line in lines[1:])
    return json.loads(env["ACCEL_LAUNCH_CONFIG"])


@pytest.mark.parametrize("spelling", ["--step_metrics", "--step-metrics"])
def test_step_metrics_flag_reaches_the_launch_configuration(tmp_path, capsys, spelling):
    script = tmp_path / "s.py"
    script.write_text("")
    launched = _launched(capsys, "--cpu", "--num_processes", "2", spelling, str(script))
    assert launched["step_metrics"] is True and "step_metrics" in launched["explicit"]


def test_without_the_flag_the_workers_get_it_off_and_not_explicit(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    launched = _launched(capsys, "--cpu", str(script))
    assert launched["step_metrics"] is False and "step_metrics" not in launched["explicit"]
