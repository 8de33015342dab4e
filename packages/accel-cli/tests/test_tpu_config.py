"""`accel tpu-config` by the gcloud command it prints under --debug (accelerate 1.15's shape),
and by what a `gcloud` on PATH receives and answers without --debug."""

from __future__ import annotations

import stat

import pytest

from accel_cli.main import main

GCLOUD = "Running gcloud compute tpus tpu-vm ssh"


@pytest.fixture(autouse=True)
def _no_default_config(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)


def _debug(capsys, *argv: str) -> str:
    assert main(["tpu-config", *argv, "--debug"]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.strip()


def test_the_command_from_flags_and_from_a_config_file(tmp_path, capsys):
    out = _debug(
        capsys, "--command", "ls", "--command", "pwd", "--tpu_zone", "z", "--tpu_name", "t"
    )
    assert out == f"{GCLOUD} t --zone z --command cd /usr/share; ls; pwd --worker all"
    commands = tmp_path / "setup.sh"
    commands.write_text("echo a\necho b\n")
    cfg = tmp_path / "tpu.yaml"  # what `accelerate config` writes for a TPU pod
    cfg.write_text(
        f"distributed_type: XLA\ntpu_name: pod\ntpu_zone: us-central2-b\ntpu_use_cluster: true\n"
        f"command_file: {commands}\nmixed_precision: bf16\n"
    )
    out = _debug(capsys, "--config_file", str(cfg), "--use_alpha", "--install_accelerate")
    assert out == (
        "Running gcloud alpha compute tpus tpu-vm ssh pod --zone us-central2-b --command "
        "cd /usr/share; pip install accel -U; echo a; echo b --worker all"
    )
    out = _debug(capsys, "--config_file", str(cfg), "--tpu_name", "other", "--command", "ls")
    assert "ssh other --zone us-central2-b --command cd /usr/share; ls --worker" in out  # flags win


@pytest.mark.parametrize(
    ("version", "installed"),
    [("latest", "accel -U"), ("0.1.0", "accel==0.1.0"), ("dev", "git+https://github.com/")],
)
def test_accelerate_version_forms(capsys, version, installed):
    argv = ["--command", "ls", "--tpu_zone", "z", "--tpu_name", "t", "--install_accelerate"]
    out = _debug(capsys, *argv, "--accelerate_version", version)
    assert f"cd /usr/share; pip install {installed}" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tpu_zone", "z", "--tpu_name", "t"], "--command or --command_file"),
        (["--command", "ls", "--tpu_zone", "z"], "--tpu_name not given"),
        (["--command", "ls"], "--tpu_name and --tpu_zone not given"),
        (["--command", "ls", "--tpu_zone", "z", "--tpu_name", "t", "--install_accelerate",
          "--accelerate_version", "newest"], "'newest' is not a version"),
    ],
)  # fmt: skip
def test_what_cannot_be_composed_is_an_error(capsys, argv, expected):
    assert main(["tpu-config", *argv, "--debug"]) == 2
    assert expected in capsys.readouterr().err


def test_without_debug_gcloud_runs_and_its_exit_code_is_returned(tmp_path, capsys, monkeypatch):
    argv = ["tpu-config", "--command", "ls", "--tpu_zone", "z", "--tpu_name", "t"]
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(argv) == 2
    assert "`gcloud` is not on PATH" in capsys.readouterr().err
    seen = tmp_path / "argv.txt"
    gcloud = tmp_path / "gcloud"
    gcloud.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\nexit ${{GCLOUD_EXIT:-0}}\n')
    gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
    assert main(argv) == 0
    assert seen.read_text().splitlines() == [
        "compute", "tpus", "tpu-vm", "ssh", "t", "--zone", "z", "--command", "cd /usr/share; ls",
        "--worker", "all",
    ]  # fmt: skip
    assert "Successfully setup pod." in capsys.readouterr().out
    monkeypatch.setenv("GCLOUD_EXIT", "3")
    assert main(argv) == 3
    assert "gcloud exited with 3" in capsys.readouterr().err
