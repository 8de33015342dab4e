"""Elastic launches: torchrun's `--nnodes MIN:MAX` (and its other spellings) resolved, checked
and turned into the torchrun command; the real run is integration-tests/test_elastic.py."""

from __future__ import annotations

import shlex

import pytest

from accel_cli import ConfigError, build_command, build_env, resolve_launch_config
from accel_cli._config import load_config_file
from accel_cli._environment import ENV_DISABLE_SHARED_STORE
from accel_cli.main import main

C10D = {"rdzv_backend": "c10d", "main_process_ip": "10.0.0.1", "main_process_port": 29400}


def _dry_run(capsys, tmp_path, *argv: str) -> tuple[list[str], dict[str, str]]:
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["launch", "--dry_run", "--cpu", *argv, str(script)]) == 0, capsys.readouterr()
    lines = capsys.readouterr().out.splitlines()
    return shlex.split(lines[0]), dict(line.split("=", 1) for line in lines[1:])


def _option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_torchrun_spellings_make_an_elastic_c10d_launch(capsys, tmp_path):
    cmd, env = _dry_run(
        capsys, tmp_path, "--nnodes", "1:4", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", "10.0.0.1:29400", "--rdzv_id", "job7", "--max_restarts", "3",
    )  # fmt: skip
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for option, value in (
        ("--nnodes", "1:4"),
        ("--nproc-per-node", "2"),
        ("--rdzv-backend", "c10d"),
        ("--rdzv-endpoint", "10.0.0.1:29400"),
        ("--rdzv-id", "job7"),
        ("--max-restarts", "3"),
    ):
        assert _option(cmd, option) == value, option
    # every rendezvous round gives the workers a new store, so that a node can join later
    assert env[ENV_DISABLE_SHARED_STORE] == "1"
    assert '"num_machines": 2' not in env["ACCEL_LAUNCH_CONFIG"]
    assert '"num_machines": 4' in env["ACCEL_LAUNCH_CONFIG"]
    assert '"num_processes": 8' in env["ACCEL_LAUNCH_CONFIG"]  # 2 per node, 4 nodes at most


def test_accelerate_spellings_and_the_config_file_take_a_range_too(tmp_path):
    resolved = resolve_launch_config({"num_machines": "2:3", **C10D}).config
    assert (resolved.min_machines, resolved.num_machines, resolved.nnodes) == (2, 3, "2:3")
    assert resolved.elastic and resolved.num_processes == 3
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nuse_cpu: true\n"
        "num_machines: '1:2'\nnum_processes: 4\nmachine_rank: 0\nmain_process_ip: 10.0.0.1\n"
        "main_process_port: 29400\nrdzv_backend: c10d\n"
    )
    config = resolve_launch_config({}, load_config_file(cfg)).config
    assert (config.nnodes, config.nproc_per_node) == ("1:2", 2)
    cmd = build_command(config, "train.py", python="py")
    assert _option(cmd, "--nnodes") == "1:2" and _option(cmd, "--nproc-per-node") == "2"
    # a flag with one number overrides the file's range, and the run is not elastic
    fixed = resolve_launch_config({"num_machines": 2}, load_config_file(cfg))
    assert fixed.config.nnodes == "2" and not fixed.config.elastic
    assert any("--num_machines 2 overrides num_machines: 1:2" in n for n in fixed.notices)
    # MIN == MAX is a fixed number of machines
    assert resolve_launch_config({"nnodes": "2:2", **C10D}).config.nnodes == "2"
    # without restarts a lost machine ends the run: said once
    notices = resolve_launch_config({"nnodes": "1:2", **C10D}).notices
    assert [n for n in notices if "pass --max_restarts N" in n]
    assert not resolve_launch_config({"nnodes": "1:2", "max_restarts": 1, **C10D}).notices


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"nnodes": "3:2"}, "--nnodes='3:2': expected a number of machines N >= 1, or an "
         "elastic range MIN:MAX with 1 <= MIN <= MAX"),
        ({"nnodes": "0:2"}, "--nnodes='0:2'"),
        ({"nnodes": "1:x"}, "--nnodes='1:x'"),
        ({"nnodes": "1:2:3"}, "--nnodes='1:2:3'"),
        ({"num_machines": "a:b"}, "--num_machines='a:b'"),
        ({"nnodes": "1:2", "main_process_ip": "10.0.0.1"}, "num_machines=1:2 is an elastic "
         "range, which torchrun's static rendezvous cannot form: add --rdzv_backend c10d"),
        ({"nnodes": "2", "num_machines": 3}, "--nnodes='2' and --num_machines=3 contradict"),
        ({"nproc_per_node": "2", "num_processes": 3, "nnodes": "1:2", **C10D},
         "--nproc_per_node='2' and --num_processes=3 contradict"),
        ({"rdzv_endpoint": "10.0.0.1"}, "--rdzv_endpoint='10.0.0.1': expected HOST:PORT"),
        ({"rdzv_endpoint": "10.0.0.1:29400", "main_process_port": 1234},
         "--rdzv_endpoint='10.0.0.1:29400' and --main_process_port=1234 contradict"),
        ({"nnodes": "1:2", "cpu": True, "mpirun_hostfile": "hosts", **C10D},
         "mpirun starts a fixed set of processes"),
    ],
)  # fmt: skip
def test_bad_ranges_and_contradictions_are_refused(flags, expected):
    with pytest.raises(ConfigError) as err:
        resolve_launch_config(flags)
    assert expected in str(err.value)


def test_deepspeed_runner_refuses_a_range(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=1\nb slots=1\n")
    cfg = tmp_path / "ds.yaml"
    cfg.write_text(
        "distributed_type: DEEPSPEED\nnum_machines: '1:2'\nnum_processes: 2\n"
        "main_process_ip: 10.0.0.1\nrdzv_backend: c10d\n"
        f"deepspeed_config:\n  deepspeed_hostfile: {hosts}\n  zero_stage: 2\n"
    )
    config = resolve_launch_config({}, load_config_file(cfg)).config
    with pytest.raises(ConfigError, match="deepspeed_multinode_launcher: standard"):
        build_command(config, "train.py")


def test_the_static_rendezvous_keeps_the_shared_store():
    fixed = resolve_launch_config({"num_processes": 2, "cpu": True}).config
    assert ENV_DISABLE_SHARED_STORE not in build_env(fixed, {})
    # the user's own choice stands
    elastic = resolve_launch_config({"nnodes": "1:2", **C10D}).config
    assert build_env(elastic, {ENV_DISABLE_SHARED_STORE: "0"})[ENV_DISABLE_SHARED_STORE] == "0"
