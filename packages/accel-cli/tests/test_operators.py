"""A Kubernetes operator's variables, as each operator sets them, resolved into the launch:
Kubeflow's TrainJob and PyTorchJob (fixed and elastic), JobSet; the precedence of flags, the
environment and the config file; values that conflict or cannot be read."""

from __future__ import annotations

import pytest

from accel_cli import (
    ConfigError,
    build_command,
    build_env,
    resolve_launch_config,
    with_rendezvous,
)
from accel_cli._config import load_config_file
from accel_cli._operators import operator_launch_values
from accel_cli.main import main

TRAINJOB = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "1",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "trainjob-node-0-0.trainjob",
    "PET_MASTER_PORT": "29400",
}
# training-operator v1 before nprocPerNode: one process per pod, WORLD_SIZE = pods
PYTORCHJOB = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
# training-operator with spec.nprocPerNode 2: WORLD_SIZE = pods x 2, RANK the pod's index
PYTORCHJOB_NPROC = {**PYTORCHJOB, "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "2",
                    "PET_NODE_RANK": "1", "PET_NNODES": "2"}  # fmt: skip
ELASTIC = {"PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
           "PET_NNODES": "1:3", "PET_MAX_RESTARTS": "3"}  # fmt: skip
JOBSET = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "js-node-0-0.js", "MASTER_PORT": "29500",
          "PET_NNODES": "2"}  # fmt: skip


def resolve(environ, flags=None, file=None, gpus=lambda: 0):
    return resolve_launch_config(flags or {}, file, operator_launch_values(environ, gpus))


def torchrun_args(config):
    return " ".join(build_command(with_rendezvous(config), "train.py", python="py"))


def test_a_trainjobs_variables_make_its_world():
    res = resolve(TRAINJOB)
    c = res.config
    assert (c.num_machines, c.num_processes, c.machine_rank) == (2, 2, 1)
    assert (c.main_process_ip, c.main_process_port) == ("trainjob-node-0-0.trainjob", 29400)
    assert "--nproc-per-node 1 --nnodes 2 --node-rank 1" in torchrun_args(c)
    assert "--rdzv-endpoint trainjob-node-0-0.trainjob:29400" in torchrun_args(c)
    assert res.environment_line() == (
        "from the environment (Kubeflow TrainJob): num_processes=2 (PET_NPROC_PER_NODE x "
        "PET_NNODES), num_machines=2 (PET_NNODES), machine_rank=1 (PET_NODE_RANK), "
        "main_process_ip=trainjob-node-0-0.trainjob (PET_MASTER_ADDR), main_process_port=29400 "
        "(PET_MASTER_PORT)"
    )
    assert not res.notices


def test_a_pytorchjobs_variables_one_process_per_pod():
    res = resolve(PYTORCHJOB)
    c = res.config
    assert (c.num_machines, c.num_processes, c.machine_rank) == (2, 2, 1)
    assert (c.main_process_ip, c.main_process_port) == ("job-master-0", 23456)
    line = res.environment_line()
    assert "(Kubeflow PyTorchJob)" in line and "num_machines=2 (WORLD_SIZE)" in line
    assert "machine_rank=1 (RANK)" in line and "main_process_ip=job-master-0 (MASTER_ADDR)" in line


def test_a_pytorchjob_with_nproc_per_node_counts_processes_in_world_size():
    c = resolve(PYTORCHJOB_NPROC).config
    assert (c.num_machines, c.num_processes, c.machine_rank) == (2, 4, 1)
    assert not resolve(PYTORCHJOB_NPROC).notices
    # WORLD_SIZE that is not pods x processes per pod: PET_ wins, as in torchrun, named
    notices = resolve({**PYTORCHJOB_NPROC, "WORLD_SIZE": "6"}).notices
    assert notices == [
        "WORLD_SIZE=6 disagrees with PET_NNODES=2 x PET_NPROC_PER_NODE=2 = 4 processes: the "
        "PET_ variables are used, as torchrun uses them; fix the manifest so that the two agree"
    ]
    # without PET_NNODES, the pods come from WORLD_SIZE / processes per pod
    only_world = {k: v for k, v in PYTORCHJOB_NPROC.items() if k != "PET_NNODES"}
    assert resolve(only_world).config.num_machines == 2
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=3 is not a multiple of PET_NPROC_PER_NODE"):
        resolve({**only_world, "WORLD_SIZE": "3"})
    with pytest.raises(ConfigError, match=r"RANK=2 \(Kubeflow PyTorchJob\) is not below the 2 "):
        resolve({**PYTORCHJOB, "RANK": "2"})


def test_an_elastic_pytorchjob_rendezvouses_on_c10d():
    res = resolve(ELASTIC)
    c = res.config
    assert (c.min_machines, c.num_machines, c.rdzv_backend, c.max_restarts) == (1, 3, "c10d", 3)
    args = torchrun_args(c)
    assert "--nnodes 1:3" in args and "--rdzv-backend c10d" in args
    assert "--rdzv-endpoint job-worker-0:23456" in args and "--max-restarts 3" in args
    assert "num_machines=1:3 (PET_NNODES)" in res.environment_line()
    assert "(Kubeflow PyTorchJob, elastic)" in res.environment_line()


def test_a_jobset_pod_takes_its_rank_from_the_completion_index():
    res = resolve(JOBSET)
    assert (res.config.num_machines, res.config.machine_rank) == (2, 1)
    assert "machine_rank=1 (JOB_COMPLETION_INDEX)" in res.environment_line()
    assert "(JobSet)" in res.environment_line()
    no_count = {k: v for k, v in JOBSET.items() if k != "PET_NNODES"}
    with pytest.raises(ConfigError, match=r"JOB_COMPLETION_INDEX=1 \(JobSet\).*set PET_NNODES"):
        resolve(no_count)
    # the count from a flag: the rank and the address still come from the pod
    c = resolve(no_count, {"num_machines": 2}).config
    assert (c.machine_rank, c.main_process_ip) == (1, "js-node-0-0.js")
    # an indexed Job of separate runs (no address): nothing is taken
    assert operator_launch_values({"JOB_COMPLETION_INDEX": "3"}) is None
    assert operator_launch_values({"MASTER_ADDR": "localhost", "MASTER_PORT": "1"}) is None


def test_a_launchers_worker_is_not_a_pod():
    """torchrun's workers have RANK, WORLD_SIZE and MASTER_ADDR too: an `accel launch` that
    one of them starts is not a PyTorchJob's pod."""
    assert operator_launch_values({**PYTORCHJOB, "LOCAL_RANK": "0"}) is None
    assert operator_launch_values({**PYTORCHJOB, "TORCHELASTIC_RUN_ID": "none"}) is None


def test_a_flag_wins_over_the_environment_which_wins_over_the_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("num_machines: 1\nmain_process_port: 1111\nmixed_precision: bf16\n")
    file = load_config_file(path)
    res = resolve(TRAINJOB, {"main_process_port": 2222}, file)
    assert res.config.main_process_port == 2222 and res.config.num_machines == 2
    assert res.config.mixed_precision == "bf16"  # the file still gives what no variable says
    assert res.sources["num_machines"] == "environment"
    assert res.sources["main_process_port"] == "flag"
    assert (
        f"PET_NNODES (Kubeflow TrainJob) sets num_machines 2 over num_machines: 1 from {path}"
        in res.notices
    )
    assert (
        "--main_process_port 2222 overrides main_process_port 29400 from PET_MASTER_PORT "
        "(Kubeflow TrainJob)" in res.notices
    )


def test_a_different_num_machines_flag_takes_the_topology_in_hand():
    res = resolve(TRAINJOB, {"num_machines": 1})
    c = res.config
    assert (c.num_machines, c.machine_rank, c.main_process_ip, c.num_processes) == (1, 0, None, 1)
    assert res.notices == [
        "--num_machines 1 overrides num_machines 2 from PET_NNODES (Kubeflow TrainJob), and with "
        "it the rank, address and processes read there: this launch forms its own world of 1 "
        "machine(s). Drop --num_machines (and --nnodes) to join the job's world."
    ]
    assert res.environment_line() is None
    # the same count as the operator's: the rest is still taken, nothing to say
    same = resolve(TRAINJOB, {"nnodes": "2"})
    assert same.config.machine_rank == 1 and not same.notices
    # processes per node from the flag, machines from the environment
    assert resolve(TRAINJOB, {"nproc_per_node": "3"}).config.num_processes == 6


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PET_NNODES", "abc", r"PET_NNODES='abc': expected a number of machines N >= 1, or an "
         r"elastic range MIN:MAX"),
        ("PET_NODE_RANK", "first", r"PET_NODE_RANK='first': expected an integer"),
        ("PET_NPROC_PER_NODE", "many", r"PET_NPROC_PER_NODE='many': expected a number of "
         r"processes per machine \(1 or more\), or auto, gpu or cpu"),
        ("PET_MASTER_PORT", "http", r"PET_MASTER_PORT='http': expected an integer"),
        ("PET_RDZV_ENDPOINT", "job-worker-0", r"PET_RDZV_ENDPOINT='job-worker-0': expected HOST:PORT"),
        ("WORLD_SIZE", "two", r"WORLD_SIZE='two': expected an integer"),
    ],
)  # fmt: skip
def test_a_malformed_variable_is_named_with_what_is_accepted(variable, value, message):
    environ = {**TRAINJOB, "WORLD_SIZE": "2", "RANK": "1", variable: value}
    with pytest.raises(ConfigError, match=message):
        operator_launch_values(environ)


def test_processes_per_node_as_torchrun_counts_them():
    one_node = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "auto", "PET_MASTER_ADDR": "x"}
    res = resolve(one_node, gpus=lambda: 8)
    # one machine: 8 processes, the rendezvous on loopback (no address taken)
    assert (res.config.num_processes, res.config.main_process_ip) == (8, None)
    with pytest.raises(ConfigError, match="PET_NPROC_PER_NODE=gpu: this pod has no GPU"):
        operator_launch_values({**one_node, "PET_NPROC_PER_NODE": "gpu"}, gpus=lambda: 0)


def test_launch_says_what_it_read_from_the_environment(tmp_path, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name, value in TRAINJOB.items():
        monkeypatch.setenv(name, value)
    assert main(["launch", "--dry_run", "--cpu", str(script)]) == 0
    out, err = capsys.readouterr()
    assert "--nproc-per-node 1 --nnodes 2 --node-rank 1" in out.splitlines()[0]
    assert "accel: from the environment (Kubeflow TrainJob): " in err
    assert "num_machines=2 (PET_NNODES)" in err
    assert main(["config", "show"]) == 0
    assert "num_machines: 2  [environment (PET_NNODES)]" in capsys.readouterr().out


def test_torchrun_gets_the_resolved_values_and_not_the_variables_they_came_from():
    """A flag that accel leaves out would take its default from a PET_ variable: on one
    machine (a flag overrode the operator's), no --rdzv-backend is passed, and torchrun would
    rendezvous on the elastic job's c10d endpoint."""
    res = resolve(ELASTIC, {"num_machines": 1, "num_processes": 2})
    env = build_env(res.config, {**ELASTIC, "PET_START_METHOD": "fork", "PATH": "/bin"})
    assert not set(ELASTIC) & set(env)
    assert env["PET_START_METHOD"] == "fork"  # torchrun's own, which accel does not read
    assert "--nnodes 1 " in torchrun_args(res.config) and "c10d" not in torchrun_args(res.config)
