"""`accel test`: one real 2-process CPU check, and the report of parts that fail."""

from __future__ import annotations

import subprocess

import pytest

from accel_cli import default_file_values, write_config_file
from accel_cli._selftest import PARTS, _print_parts
from accel_testkit.launch import accel_command, worker_env


@pytest.mark.needs("accel")
def test_accel_test_passes_on_two_cpu_processes(tmp_path):
    cfg = write_config_file(tmp_path / "cpu2.yaml", default_file_values(cpu=True, num_processes=2))
    run = subprocess.run(
        accel_command("test", "--config_file", cfg),
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "accel test: 2 process(es) on 1 machine(s), CPU, mixed precision no"
    for label in PARTS.values():
        assert any(line.split("  ")[1:2] == [label] and " pass " in line for line in lines), label
    assert "2 processes, backend gloo, device cpu" in run.stdout
    assert lines[-1] == "all parts passed"


def _part(status, detail="d"):
    return {"status": status, "detail": detail}


def test_a_failing_or_silent_rank_fails_its_part():
    said: list[str] = []
    reports = {
        0: {"parts": {"start": _part("pass"), "collectives": _part("pass"),
                      "training": _part("fail", "differs by 0.3"),
                      "checkpoint": _part("skip", "not run")}},
        1: {"parts": {"start": _part("pass")}},  # died after starting
    }  # fmt: skip
    assert _print_parts(reports, said.append) is True
    text = "\n".join(said)
    assert "collectives                 FAIL  no result from rank(s) 1" in text
    assert "training matches 1 process  FAIL  rank 0: differs by 0.3" in text
    assert "checkpoint round-trip       FAIL  no result from rank(s) 1" in text
    said.clear()
    every = {p: _part("pass") for p in PARTS}
    assert _print_parts({0: {"parts": every}, 1: {"parts": every}}, said.append) is False
    skipped = {**every, "training": _part("skip", "accel is not installed")}
    assert _print_parts({0: {"parts": skipped}}, said.append) is False
    assert "skip  accel is not installed" in said[-2]
    assert _print_parts({0: None}, said.append) is True
