"""Topology detection from each launcher's variables, and the errors for inconsistent setups."""

from __future__ import annotations

import datetime

import pytest
import torch

from accel_state import (
    DistributedType,
    InitProcessGroupKwargs,
    PartialState,
    detect_launch,
    first_slurm_host,
)
from accel_state._environment import ENV_ACCEL_CONFIG


def test_no_launcher_is_a_single_process() -> None:
    info = detect_launch({})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("none", 0, 1, 0)


def test_torchrun_variables() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "1234",
    }
    info = detect_launch(env)
    assert info.launcher == "torchrun"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (5, 8, 1, 4)
    assert (info.node_rank, info.master_addr, info.master_port) == (1, "10.1.2.3", 1234)


def test_torchrun_wins_over_slurm() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "16"}
    assert detect_launch(env).launcher == "torchrun"


def test_slurm_variables_and_node_list() -> None:
    env = {
        "SLURM_PROCID": "6",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "2",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_JOB_NODELIST": "gpu[017-018,020],cpu01",
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "0",
    }
    info = detect_launch(env)
    assert info.launcher == "slurm"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (6, 8, 2, 4)
    assert info.node_rank == 1
    assert info.master_addr == "gpu017"
    assert info.master_port == 15000 + 123456 % 20000
    # an explicit MASTER_ADDR wins over the node list
    assert detect_launch({**env, "MASTER_ADDR": "head"}).master_addr == "head"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("node1", "node1"), ("a[3-5]", "a3"), ("a[007,9]", "a007"), ("x,y", "x"), ("n[1-2],m", "n1")],
)
def test_first_slurm_host(nodelist: str, first: str) -> None:
    assert first_slurm_host(nodelist) == first


def test_openmpi_variables() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.node_rank) == (
        "openmpi",
        3,
        4,
        1,
        1,
    )


def test_mpich_and_intel_mpi_variables() -> None:
    env = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpich", 2, 3, 0)


def test_mvapich_variables() -> None:
    env = {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_RANK": "1"}
    assert detect_launch(env).launcher == "mvapich"


def test_non_integer_variable_is_named() -> None:
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        detect_launch({"RANK": "0", "WORLD_SIZE": "two"})


def _clear_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        ENV_ACCEL_CONFIG,
    ):
        monkeypatch.delenv(name, raising=False)
    for name in ("SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_single_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_launch_env(monkeypatch)
    state = PartialState(cpu=True)
    assert state.device == torch.device("cpu")
    assert state.distributed_type == DistributedType.NO
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed
    # one topology, shared, immutable
    assert PartialState().process_index == 0
    with pytest.raises(AttributeError, match="immutable"):
        state.num_processes = 4  # type: ignore[misc]
    with pytest.warns(UserWarning, match="already created"):
        PartialState(num_processes=2)


def test_rank_beyond_world_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_launch_env(monkeypatch)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="rank 2 is outside the world of 2"):
        PartialState(cpu=True)


def test_multi_process_without_rendezvous_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_launch_env(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="needs a rendezvous address"):
        PartialState(cpu=True)


def test_unknown_backend_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_launch_env(monkeypatch)
    with pytest.raises(ValueError, match="backend='nope' is not available.*gloo"):
        PartialState(cpu=True, backend="nope")


def test_explicit_arguments_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_launch_env(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = PartialState(cpu=True, num_processes=1)
    assert state.num_processes == 1


def test_launch_config_supplies_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_launch_env(monkeypatch)
    monkeypatch.setenv(ENV_ACCEL_CONFIG, '{"cpu": true}')
    assert PartialState().device.type == "cpu"
    PartialState._reset_state()
    monkeypatch.setenv(ENV_ACCEL_CONFIG, "not json")
    with pytest.raises(ValueError, match="valid JSON"):
        PartialState()


def test_local_rank_beyond_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel_state._state as st

    monkeypatch.setattr(st, "_accelerator_type", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeError, match="Local rank 3 has no cuda device: only 2 are visible"):
        st._pick_device(cpu=False, local_rank=3, world_size=8)


def test_init_process_group_kwargs() -> None:
    kw = InitProcessGroupKwargs(backend="gloo", timeout=30)
    assert kw.timeout == datetime.timedelta(seconds=30)
    with pytest.raises(ValueError, match="timeout=-1"):
        InitProcessGroupKwargs(timeout=-1)
    # accelerate's positional order; `extra` (accel's) stays keyword-only
    positional = InitProcessGroupKwargs("gloo", "tcp://127.0.0.1:29500", 5)
    assert (positional.backend, positional.init_method) == ("gloo", "tcp://127.0.0.1:29500")
    assert positional.timeout == datetime.timedelta(seconds=5)
    with pytest.raises(TypeError):
        InitProcessGroupKwargs("gloo", None, None, {})  # type: ignore[misc]
    assert InitProcessGroupKwargs(extra={"device_id": None}).to_kwargs() == {"device_id": None}
    kw.timeout = datetime.timedelta(seconds=60)  # mutable, as accelerate's is
    assert kw.to_kwargs() == {"backend": "gloo", "timeout": datetime.timedelta(seconds=60)}


def _slurm_worker() -> dict:
    state = PartialState(cpu=True)
    return {"launcher": state.launcher, "rank": state.process_index, "world": state.num_processes}


def test_slurm_world_creates_a_real_process_group() -> None:
    from accel_state.testing import free_port, run_distributed

    # Pretend srun started the tasks: hide torchrun's variables behind SLURM's.
    port = free_port()
    env = {
        "SLURM_NTASKS": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    results = run_distributed(_slurm_from_env, world_size=2, env=env)
    assert [r["launcher"] for r in results] == ["slurm", "slurm"]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 for r in results)


def _slurm_from_env() -> dict:
    import os

    os.environ["SLURM_PROCID"] = os.environ.pop("RANK")
    os.environ["SLURM_LOCALID"] = os.environ.pop("LOCAL_RANK")
    del os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]
    return _slurm_worker()
