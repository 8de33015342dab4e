"""SLURM allocations read from the environment, and stop requests on a direct launch."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from accel_cli._config import ConfigError
from accel_cli._run import STOPPED_EXIT_CODE
from accel_cli._slurm import expand_hostlist, first_host, slurm_launch_values
from accel_cli._torchrun import without_sigterm
from accel_cli.main import main
from accel_testkit.launch import accel_command, worker_env

_NO_SCONTROL = {"which": lambda name: None}


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[003-005,009],login", ["gpu003", "gpu004", "gpu005", "gpu009", "login"]),
        ("a[1-2]-ib[7,9]", ["a1-ib7", "a1-ib9", "a2-ib7", "a2-ib9"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
    ],
)
def test_compact_host_lists_expand(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["gpu[1-", "gpu[x-2]", "gpu[5-2]", ""])
def test_unreadable_host_lists_name_the_problem(bad):
    with pytest.raises(ValueError, match="SLURM host list"):
        expand_hostlist(bad)


def test_scontrol_is_asked_first_when_present():
    def run(argv, **kwargs):
        assert argv[1:] == ["show", "hostnames", "weird[1-2]"]
        return subprocess.CompletedProcess(argv, 0, stdout="alpha\nbeta\n", stderr="")

    assert first_host("weird[1-2]", which=lambda n: "/usr/bin/scontrol", run=run) == "alpha"
    assert first_host("weird[1-2]", **_NO_SCONTROL) == "weird1"


def test_allocation_values():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "2",
           "SLURM_JOB_NODELIST": "gpu[011-014]", "SLURM_STEP_ID": "0"}  # fmt: skip
    values = slurm_launch_values(env, **_NO_SCONTROL)
    assert values == {"num_machines": 4, "machine_rank": 2, "main_process_ip": "gpu011"}
    assert slurm_launch_values({**env, "SLURM_JOB_NUM_NODES": "1"}, **_NO_SCONTROL) == {}
    assert slurm_launch_values({"SLURM_JOB_NUM_NODES": "4"}, **_NO_SCONTROL) == {}
    with pytest.raises(ConfigError, match="--num_machines"):
        slurm_launch_values({**env, "SLURM_NODEID": "x"}, **_NO_SCONTROL)


def test_the_batch_script_and_salloc_shell_are_one_machine():
    """sbatch --nodes=2: the batch script runs once, on the first node, with the job's node
    count but no step id (salloc's shell: a reserved one). One launcher there is one machine."""
    batch = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
             "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "cn[1-2]"}  # fmt: skip
    assert slurm_launch_values(batch, **_NO_SCONTROL) == {}
    shell = {**batch, "SLURM_STEP_ID": "4294967290", "SLURM_STEP_NUM_NODES": "1"}
    assert slurm_launch_values(shell, **_NO_SCONTROL) == {}
    with pytest.raises(ConfigError, match="SLURM_STEP_ID='x'"):
        slurm_launch_values({**batch, "SLURM_STEP_ID": "x"}, **_NO_SCONTROL)


def test_a_step_counts_its_own_nodes_not_the_jobs():
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "cn[1-3]",
           "SLURM_STEP_ID": "2", "SLURM_NODEID": "1"}  # fmt: skip
    # srun -N1 in a job of three nodes: one machine.
    assert slurm_launch_values({**job, "SLURM_STEP_NUM_NODES": "1"}, **_NO_SCONTROL) == {}
    # srun -N2 -w cn[2-3]: two machines, node 0 of the step is cn2.
    step = {**job, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "cn[2-3]"}
    values = slurm_launch_values(step, **_NO_SCONTROL)
    assert values == {"num_machines": 2, "machine_rank": 1, "main_process_ip": "cn2"}


def test_launch_inside_an_allocation_builds_the_multi_node_command(tmp_path, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the parser reads the list
    for name, value in {"SLURM_JOB_ID": "5", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
                        "SLURM_NODELIST": "cn[07-08]", "SLURM_STEP_ID": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    argv = ["launch", "--dry_run", "--cpu", "--num_processes", "4", str(script)]
    assert main(argv) == 0
    cmd = capsys.readouterr().out.splitlines()[0]
    assert "--nproc-per-node 2 --nnodes 2 --node-rank 1" in cmd
    # the step's own port (15000 + (job 5 x 31 + step 0) mod 10000), not 29500: two jobs
    # sharing nodes do not meet; a flag or the file still wins
    assert "--rdzv-endpoint cn07:15155" in cmd
    assert main([*argv[:2], "--main_process_port", "29500", *argv[2:]]) == 0
    assert "--rdzv-endpoint cn07:29500" in capsys.readouterr().out
    assert main([*argv[:2], "--num_machines", "1", *argv[2:]]) == 0  # a flag wins
    assert "--nnodes 1 " in capsys.readouterr().out


def test_a_stop_request_on_a_direct_launch_exits_with_the_stopped_code(tmp_path):
    """SIGUSR1 does not kill a script that ignores it; the stop (SIGTERM) is honoured with
    a clean exit, and the launcher reports STOPPED_EXIT_CODE."""
    script = tmp_path / "job.py"
    ready = tmp_path / "ready"
    script.write_text(
        "import pathlib, signal, sys, time\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))\n"
        "out.write_text('ready')\n"
        "time.sleep(60)\n"
        "out.write_text('not stopped')\n"
    )
    proc = subprocess.Popen(accel_command("launch", script, ready), env=worker_env())
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "script never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # forwarded; ignored by the script
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == STOPPED_EXIT_CODE
        assert ready.read_text() == "ready"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_torchrun_is_left_every_signal_but_sigterm():
    assert without_sigterm("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == "SIGINT,SIGHUP,SIGQUIT"
    assert without_sigterm(" SIGUSR1 , SIGTERM") == "SIGUSR1"
    assert without_sigterm("SIGTERM") is None
