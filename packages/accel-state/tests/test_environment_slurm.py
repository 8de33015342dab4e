"""SLURM's variables as a real cluster sets them (slurm-wlm 22.05, recorded with
tools/slurm/cluster.sh): which processes are tasks of an srun step, and their topology."""

from __future__ import annotations

import pytest

from accel_state import detect_launch
from accel_state._environment import expand_tasks_per_node, in_slurm_step

# The batch script of `sbatch --nodes=2 --ntasks=3`: SLURM_PROCID=0 and the job's task
# count, but no step id. One process.
BATCH = {
    "SLURM_JOB_ID": "2",
    "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "127.0.0.[1-2]",
    "SLURM_NPROCS": "3",
    "SLURM_NTASKS": "3",
    "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "2,1",
}
# Task 1 of `srun -N1 -n2` inside that job: the step's counts replace the job's.
SRUN_ONE_NODE = {
    **BATCH,
    "SLURM_LOCALID": "1",
    "SLURM_NNODES": "1",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "127.0.0.1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2",
}
# Task 2 of `srun -N2 -n3`: the one task of the second node.
SRUN_TWO_NODES = {
    **BATCH,
    "SLURM_PROCID": "2",
    "SLURM_NODEID": "1",
    "SLURM_STEPID": "1",
    "SLURM_STEP_ID": "1",
    "SLURM_STEP_NODELIST": "127.0.0.[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_STEP_TASKS_PER_NODE": "2,1",
}
# salloc's shell with LaunchParameters=use_interactive_step: a step of SLURM's own
# (0xfffffffa), SLURM_PROCID=0 and the job's task count. One process.
SALLOC_SHELL = {
    "SLURM_JOB_ID": "4",
    "SLURM_JOB_NODELIST": "127.0.0.1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_STEPID": "4294967290",
    "SLURM_STEP_ID": "4294967290",
    "SLURM_STEP_NODELIST": "127.0.0.1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "2",
}


@pytest.mark.parametrize(
    "env",
    [
        BATCH,
        SALLOC_SHELL,
        {**BATCH, "SLURM_STEP_ID": "4294967291"},  # the batch step's id since 20.11
        {**BATCH, "SLURM_STEP_ID": "4294967294"},  # ... and before
        {**BATCH, "SLURM_STEP_ID": "4294967292"},  # the extern step
        {**BATCH, "SLURM_STEP_ID": "-5"},  # a reserved id printed signed
    ],
    ids=["batch", "salloc-shell", "batch-id", "old-batch-id", "extern", "signed"],
)
def test_the_batch_script_and_salloc_shell_are_one_process(env: dict[str, str]) -> None:
    info = detect_launch(env)
    assert not in_slurm_step(env)
    assert (info.launcher, info.rank, info.world_size, info.local_world_size) == ("none", 0, 1, 1)


def test_srun_on_one_node_counts_the_tasks_of_the_node() -> None:
    info = detect_launch(SRUN_ONE_NODE)
    assert (info.launcher, info.rank, info.world_size) == ("slurm", 1, 2)
    assert (info.local_rank, info.local_world_size, info.node_rank) == (1, 2, 0)
    assert info.master_addr == "127.0.0.1"
    assert info.master_port == 15000 + 2 % 20000


def test_srun_over_two_nodes_reads_this_nodes_entry() -> None:
    info = detect_launch(SRUN_TWO_NODES)
    assert (info.rank, info.world_size, info.local_rank) == (2, 3, 0)
    assert (info.local_world_size, info.node_rank) == (1, 1)
    node0 = detect_launch({**SRUN_TWO_NODES, "SLURM_PROCID": "1", "SLURM_NODEID": "0"})
    assert node0.local_world_size == 2


def test_the_old_step_id_spelling_alone_is_enough() -> None:
    env = {k: v for k, v in SRUN_ONE_NODE.items() if k != "SLURM_STEP_ID"}
    assert detect_launch(env).launcher == "slurm"


def test_the_step_list_wins_over_a_stale_ntasks_per_node() -> None:
    # `srun -n1` in a job of --ntasks-per-node=2: SLURM_NTASKS_PER_NODE is the job's.
    env = {**SRUN_ONE_NODE, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    env.update(SLURM_NTASKS_PER_NODE="2", SLURM_STEP_TASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1")
    assert detect_launch(env).local_world_size == 1
    # Without a per-node list (an older or trimmed environment), --ntasks-per-node is used.
    bare = {k: v for k, v in env.items() if not k.endswith("TASKS_PER_NODE")}
    assert detect_launch({**bare, "SLURM_NTASKS_PER_NODE": "4"}).local_world_size == 4
    assert detect_launch(bare).local_world_size == 1


def test_the_rendezvous_host_is_the_first_node_of_the_step() -> None:
    # `srun -N1 -w 127.0.0.2` in a job over 127.0.0.[1-2]: task 0 runs on the second node.
    env = {**SRUN_ONE_NODE, "SLURM_STEP_NODELIST": "127.0.0.2"}
    assert detect_launch(env).master_addr == "127.0.0.2"
    assert detect_launch({**env, "MASTER_ADDR": "head"}).master_addr == "head"


@pytest.mark.parametrize(
    ("value", "counts"),
    [("2", [2]), ("2,1", [2, 1]), ("2(x3),1", [2, 2, 2, 1]), ("1,4(x2)", [1, 4, 4])],
)
def test_tasks_per_node_expand(value: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(value) == counts


def test_unreadable_slurm_values_are_named() -> None:
    with pytest.raises(ValueError, match=r"'2\(3\)'.*'2\(x3\)'"):
        detect_launch({**SRUN_ONE_NODE, "SLURM_STEP_TASKS_PER_NODE": "2(3)"})
    with pytest.raises(ValueError, match="SLURM_NODEID=3 has no entry in SLURM_STEP_TASKS"):
        detect_launch({**SRUN_TWO_NODES, "SLURM_NODEID": "3"})
    with pytest.raises(ValueError, match="SLURM_STEP_ID='batch'"):
        detect_launch({**SRUN_ONE_NODE, "SLURM_STEP_ID": "batch"})
