"""Flags, config file and defaults resolved as pure functions; the child's argv and env."""

from __future__ import annotations

import json
import textwrap

import pytest

from accel_cli import (
    ConfigError,
    LaunchConfig,
    build_command,
    build_env,
    load_config_file,
    resolve_launch_config,
    with_rendezvous,
)
from accel_cli._schema import PRECISIONS

# What `accelerate config` writes for a 2-GPU machine with FSDP (keys of accelerate 1.x).
ACCELERATE_FSDP_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
gpu_ids: 0,1
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_names_match_accel_state():
    from accel_cli import ENV_ACCEL_CONFIG
    from accel_state import PrecisionType
    from accel_state._environment import ENV_ACCEL_CONFIG as STATE_NAME

    assert ENV_ACCEL_CONFIG == STATE_NAME
    assert set(PRECISIONS) == {p.value for p in PrecisionType}


def test_defaults_without_file_or_flags():
    res = resolve_launch_config({})
    assert res.config == LaunchConfig()
    assert not res.config.distributed
    assert set(res.sources.values()) == {"default"}
    assert res.notices == []


def test_accelerate_yaml_is_accepted_and_handed_down(tmp_path):
    file = load_config_file(write(tmp_path, ACCELERATE_FSDP_YAML))
    assert file.noted == ()  # every noted key holds its inert default here
    res = resolve_launch_config({}, file)
    cfg = res.config
    assert (cfg.num_processes, cfg.mixed_precision, cfg.gpu_ids, cfg.cpu) == (
        2,
        "bf16",
        "0,1",
        False,
    )
    assert res.sources["num_processes"] == "file" and res.sources["backend"] == "default"
    worker = cfg.to_worker_dict()
    assert worker["distributed_type"] == "FSDP"
    assert worker["fsdp_config"]["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert worker["config_file"] == str(tmp_path / "cfg.yaml")
    assert json.loads(json.dumps(worker)) == worker


def test_flag_beats_file_with_a_notice_naming_both(tmp_path):
    file = load_config_file(write(tmp_path, ACCELERATE_FSDP_YAML))
    flags = {"mixed_precision": "fp16", "num_processes": 2, "cpu": True}
    res = resolve_launch_config(flags, file)
    assert res.config.mixed_precision == "fp16" and res.config.cpu is True
    assert res.sources["mixed_precision"] == "flag"
    path = tmp_path / "cfg.yaml"
    assert res.notices == [
        f"--mixed_precision fp16 overrides mixed_precision: bf16 from {path}",
        f"--cpu true overrides use_cpu: false from {path}",
    ]
    # The same value as the file (num_processes 2) is no contradiction.
    assert not any("num_processes" in n for n in res.notices)


def test_tpu_only_keys_are_noted_and_yaml_quirks(tmp_path):
    # Keys only a TPU launch or `tpu-config` reads (a config written for tpu-config, as
    # accelerate's tests/test_configs/latest.yaml): accelerate launches it when its
    # distributed_type is not XLA, and so does accel, noting them.
    path = write(
        tmp_path,
        """\
        distributed_type: MULTI_CPU
        mixed_precision: no
        num_processes: -1
        main_training_function: train
        tpu_name: my-tpu
        tpu_zone: us-central1-a
        command_file: tests/test_samples/test_command_file.sh
        fp16: true
        """,
    )
    file = load_config_file(path)
    assert file.refused == ()
    assert file.noted == ("main_training_function", "tpu_name", "tpu_zone", "command_file")
    xla = load_config_file(write(tmp_path, "distributed_type: XLA\ntpu_name: my-tpu\n", "xla.yaml"))
    assert xla.refused == ()  # `accel launch` runs it on XLA devices (--tpu)
    cfg = resolve_launch_config({}, file).config
    # YAML reads a bare `no` as false; -1 is accelerate's "unset"; MULTI_CPU means the CPU.
    assert cfg.mixed_precision == "no" and cfg.num_processes == 1 and cfg.cpu is True
    assert "distributed_type" not in cfg.to_worker_dict()  # a topology type, not a strategy


def test_old_fp16_spelling(tmp_path):
    file = load_config_file(write(tmp_path, "distributed_type: NO\nfp16: true\n"))
    assert resolve_launch_config({}, file).config.mixed_precision == "fp16"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mixed_precison: bf16\n", "'mixed_precision'"),
        ("cpu: true\n", "'use_cpu'"),
        (
            "fsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n",
            "'fsdp_config.fsdp_sharding_strategy'",
        ),
        ("deepspeed_config:\n  zero_stge: 3\n", "'deepspeed_config.zero_stage'"),
    ],
)
def test_unknown_key_names_key_file_and_closest(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config_file(path)
    message = str(err.value)
    assert "Unknown key" in message and str(path) in message
    assert f"Did you mean {expected}?" in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("distributed_type: MULTI_GPUS\n", "Did you mean 'MULTI_GPU'"),
        ("compute_environment: AMAZON_SAGEMAKER\n", "LOCAL_MACHINE"),
        ("- a\n- b\n", "mapping"),
        ("num_processes: [\n", "not valid YAML"),
        ("fsdp_config: FULL_SHARD\n", "must be a mapping"),
    ],
)
def test_bad_files_are_explained(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config_file(write(tmp_path, text))


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"num_processes": 3, "num_machines": 2, "main_process_ip": "h"}, "--num_processes 2 or 4"),
        ({"num_machines": 2}, "needs --main_process_ip"),
        ({"machine_rank": 1}, "0 <= machine_rank < num_machines"),
        ({"num_processes": 0}, "at least 1"),
        ({"mixed_precision": "fp32"}, "expected one of no, fp16"),
        ({"gpu_ids": "0;1"}, "'0,1'"),
        ({"gpu_ids": "0", "num_processes": 2}, "lists 1 device"),
        ({"main_process_port": 70000}, "1 to 65535"),
        ({"rdzv_backend": "zmq"}, "static, c10d"),
        ({"num_processes": "two"}, "--num_processes='two': expected an integer"),
    ],
)
def test_bad_values_are_explained(flags, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        resolve_launch_config(flags)


def test_bad_value_in_file_names_the_file(tmp_path):
    file = load_config_file(write(tmp_path, "num_machines: many\n"))
    with pytest.raises(ConfigError, match=r"num_machines in '.*cfg\.yaml'='many'"):
        resolve_launch_config({}, file)


def test_num_processes_is_the_total_across_machines():
    cfg = resolve_launch_config(
        {"num_processes": 8, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.1.2.3"}
    ).config
    assert cfg.nproc_per_node == 4
    # Left out, it is one process per listed GPU on each machine.
    assert resolve_launch_config({"gpu_ids": "0,1,2"}).config.num_processes == 3
    cfg = resolve_launch_config({"num_machines": 2, "main_process_ip": "h"}).config
    assert cfg.num_processes == 2


def test_torchrun_argv_for_multi_node():
    flags = {
        "num_processes": 8,
        "num_machines": 2,
        "machine_rank": 1,
        "main_process_ip": "10.1.2.3",
    }
    cfg = with_rendezvous(resolve_launch_config(flags).config)
    cmd = build_command(cfg, "train.py", ["--lr", "0.1"], python="py")
    assert cmd == [
        "py", "-m", "torch.distributed.run",
        "--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1",
        "--rdzv-backend", "static", "--rdzv-endpoint", "10.1.2.3:29500",
        "train.py", "--lr", "0.1",
    ]  # fmt: skip
    # --same_network: the machines reach the main one directly, by address and port.
    cfg = with_rendezvous(resolve_launch_config({**flags, "same_network": True}).config)
    cmd = build_command(cfg, "train.py", python="py")
    assert cmd[9:14] == ["--master-addr", "10.1.2.3", "--master-port", "29500", "train.py"]


def test_torchrun_argv_for_c10d_module_and_restarts():
    cfg = resolve_launch_config(
        {
            "num_processes": 4,
            "num_machines": 2,
            "main_process_ip": "head",
            "main_process_port": 1234,
            "rdzv_backend": "c10d",
            "max_restarts": 3,
        }
    ).config
    cmd = build_command(with_rendezvous(cfg), "pkg.train", ["x"], module=True, python="py")
    assert cmd[3:] == [
        "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:1234",
        "--max-restarts", "3", "-m", "pkg.train", "x",
    ]  # fmt: skip


def test_one_machine_gets_loopback_and_a_free_port_and_one_process_runs_directly():
    cfg = with_rendezvous(resolve_launch_config({"num_processes": 2}).config)
    assert cfg.main_process_ip == "127.0.0.1" and 0 < cfg.main_process_port < 65536
    single = with_rendezvous(LaunchConfig())
    assert single.main_process_port is None
    assert build_command(single, "s.py", ["a"], python="py") == ["py", "s.py", "a"]
    assert build_command(single, "m", [], module=True, python="py") == ["py", "-m", "m"]


def test_child_environment():
    base = {"PATH": "/bin"}
    cfg = resolve_launch_config({"num_processes": 2, "cpu": True, "gpu_ids": "1,3"}).config
    env = build_env(cfg, base, cpu_cores=8)
    assert json.loads(env["ACCEL_LAUNCH_CONFIG"]) == cfg.to_worker_dict()
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["OMP_NUM_THREADS"] == "4"  # the cores split between the CPU workers
    assert set(env) == {
        "PATH", "ACCEL_LAUNCH_CONFIG", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
        "KMP_AFFINITY", "KMP_BLOCKTIME",  # Intel OpenMP's placement for CPU runs, as accelerate
    }  # fmt: skip
    assert base == {"PATH": "/bin"}
    gpu = resolve_launch_config({"num_processes": 2}).config
    assert build_env(gpu, base)["OMP_NUM_THREADS"] == "1"
    assert build_env(gpu, {"OMP_NUM_THREADS": "6"})["OMP_NUM_THREADS"] == "6"
    threads = resolve_launch_config({"num_processes": 2, "num_cpu_threads_per_process": 3}).config
    assert build_env(threads, {"OMP_NUM_THREADS": "6"})["OMP_NUM_THREADS"] == "3"
    assert set(build_env(LaunchConfig(), base)) == {"PATH", "ACCEL_LAUNCH_CONFIG"}


def test_worker_dict_names_the_explicit_fields_only() -> None:
    from accel_cli import resolve_launch_config

    resolved = resolve_launch_config({"mixed_precision": "bf16", "num_processes": 2})
    explicit = resolved.config.to_worker_dict()["explicit"]
    assert explicit == ["mixed_precision", "num_processes"]
