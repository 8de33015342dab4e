"""Which config file is in effect, and writing one that both accel and accelerate read."""

from __future__ import annotations

import pytest
import yaml

from accel_cli import (
    ConfigError,
    default_config_path,
    default_file_values,
    find_config_file,
    load_config_file,
    resolve_launch_config,
    write_config_file,
)


def test_default_path_order(tmp_path):
    assert str(default_config_path({"HOME": "/h"})) == "/h/.config/accel/default_config.yaml"
    assert str(default_config_path({"HOME": "/h", "XDG_CONFIG_HOME": "/x"})) == (
        "/x/accel/default_config.yaml"
    )
    env = {"HOME": "/h", "XDG_CONFIG_HOME": "/x", "ACCEL_CONFIG_FILE": "/c/my.yaml"}
    assert str(default_config_path(env)) == "/c/my.yaml"


def test_explicit_file_wins_and_the_default_is_not_layered_under_it(tmp_path):
    xdg = tmp_path / "xdg"
    default = write_config_file(
        xdg / "accel" / "default_config.yaml",
        {"num_machines": 3, "machine_rank": 0, "main_process_ip": "h"},
    )
    mine = write_config_file(tmp_path / "mine.yaml", {"mixed_precision": "bf16"})
    env = {"XDG_CONFIG_HOME": str(xdg)}
    assert find_config_file(None, env) == (default, "default location")
    assert find_config_file(mine, env) == (mine, "--config_file")
    cfg = resolve_launch_config({}, load_config_file(mine)).config
    assert cfg.num_machines == 1 and cfg.mixed_precision == "bf16"
    assert find_config_file(None, {"XDG_CONFIG_HOME": str(tmp_path / "empty")}) is None


def test_missing_files_are_errors_not_silence(tmp_path):
    with pytest.raises(ConfigError, match="accel config default --config_file"):
        find_config_file(tmp_path / "nope.yaml", {})
    with pytest.raises(ConfigError, match=r"\$ACCEL_CONFIG_FILE=.*names no file"):
        find_config_file(None, {"ACCEL_CONFIG_FILE": str(tmp_path / "gone.yaml")})
    env_file = write_config_file(tmp_path / "env.yaml", {"use_cpu": True})
    assert find_config_file(None, {"ACCEL_CONFIG_FILE": str(env_file)}) == (
        env_file,
        "$ACCEL_CONFIG_FILE",
    )


def test_write_refuses_to_overwrite_without_force(tmp_path):
    path = write_config_file(tmp_path / "a" / "b.yaml", default_file_values(mixed_precision="fp16"))
    with pytest.raises(ConfigError, match="--force"):
        write_config_file(path, default_file_values())
    assert yaml.safe_load(path.read_text())["mixed_precision"] == "fp16"
    write_config_file(path, default_file_values(cpu=True, num_processes=4), force=True)
    cfg = resolve_launch_config({}, load_config_file(path)).config
    assert (cfg.cpu, cfg.num_processes, cfg.mixed_precision) == (True, 4, "no")
    assert [p.name for p in path.parent.iterdir()] == ["b.yaml"]  # no temporary left behind


def test_default_values_have_accelerates_shape():
    values = default_file_values(cpu=True, num_processes=2)
    assert (
        values["distributed_type"] == "MULTI_CPU"
        and values["compute_environment"] == "LOCAL_MACHINE"
    )
    assert default_file_values()["distributed_type"] == "NO"
    assert default_file_values(num_processes=2)["distributed_type"] == "MULTI_GPU"
    with pytest.raises(ConfigError, match="fp17"):
        default_file_values(mixed_precision="fp17")
