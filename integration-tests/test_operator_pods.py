"""`accel launch --cpu SCRIPT`, with no launch flag, on two "pods" that carry a Kubernetes
operator's variables, as the operator sets them: the world of 2 forms from the environment.

No Kubernetes control plane runs here. Each pod is a namespaced host of tools/netns (its own
network stack, cluster link eth1), and its own /etc/hosts (iproute2's /etc/netns/NAME/hosts,
which `ip netns exec` binds over /etc/hosts) resolves the DNS names the operator's headless
service would: `<trainjob>-node-0-0.<trainjob>` (Kubeflow TrainJob), `<job>-master-0`
(Kubeflow PyTorchJob), `<jobset>-<job>-0-0.<jobset>` (JobSet). Each pod trains the small DDP
loop of _multihost_train.py (2 pods x 1 process) and writes its own final weights: both saw a
world of 2 and hold the same weights, equal to one process of plain PyTorch; each launcher
named the variables it read on its "from the environment" line, and the preflight checked
the world they give.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from accel_testkit.launch import LAUNCHER_VARS, accel_command, worker_env
from accel_testkit.netns import Hosts, hosts_or_skip
from accel_testkit.tolerance import assert_same_training, float32_error, norm_terms

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "_multihost_train.py"
TIMEOUT = 120
pytestmark = [pytest.mark.slow, pytest.mark.serial]

sys.path.insert(0, str(HERE))
try:
    import _multihost_train as train
finally:
    sys.path.remove(str(HERE))

# Each operator's variables for the pod of index i, and what its line must name.
OPERATORS = {
    "trainjob": (
        lambda i: {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(i),
            "PET_MASTER_ADDR": "trainjob-node-0-0.trainjob",
            "PET_MASTER_PORT": "29400",
            "JOB_COMPLETION_INDEX": str(i),  # a TrainJob's pods are a JobSet's
        },
        "from the environment (Kubeflow TrainJob): num_processes=2 (PET_NPROC_PER_NODE x "
        "PET_NNODES), num_machines=2 (PET_NNODES), machine_rank={i} (PET_NODE_RANK), "
        "main_process_ip=trainjob-node-0-0.trainjob (PET_MASTER_ADDR), main_process_port=29400 "
        "(PET_MASTER_PORT)",
    ),
    "pytorchjob": (  # a Master and one Worker: RANK 0 and 1, one process per pod
        lambda i: {
            "MASTER_ADDR": "pytorchjob-master-0",
            "MASTER_PORT": "23456",
            "WORLD_SIZE": "2",
            "RANK": str(i),
            "PYTHONUNBUFFERED": "0",
        },
        "from the environment (Kubeflow PyTorchJob): num_processes=2 (WORLD_SIZE), "
        "num_machines=2 (WORLD_SIZE), machine_rank={i} (RANK), "
        "main_process_ip=pytorchjob-master-0 (MASTER_ADDR), main_process_port=23456 "
        "(MASTER_PORT)",
    ),
    "jobset": (  # the manifest names pod 0 and the pods, as JobSet's torchrun examples do
        lambda i: {
            "JOB_COMPLETION_INDEX": str(i),
            "MASTER_ADDR": "jobset-workers-0-0.jobset",
            "MASTER_PORT": "3389",
            "PET_NNODES": "2",
        },
        "from the environment (JobSet): num_machines=2 (PET_NNODES), machine_rank={i} "
        "(JOB_COMPLETION_INDEX), main_process_ip=jobset-workers-0-0.jobset (MASTER_ADDR), "
        "main_process_port=3389 (MASTER_PORT)",
    ),
}
POD_NAMES = ("trainjob-node-{i}-0.trainjob", "pytorchjob-{role}-{j}", "jobset-workers-0-{i}.jobset")


@pytest.fixture(scope="module")
def pods() -> Iterator[Hosts]:
    """Two hosts, each with a hosts file that resolves every pod's DNS name."""
    name = f"accop{os.getpid() % 100000}"
    with hosts_or_skip(name, 2) as hosts:
        etc = [Path("/etc/netns") / f"{name}-h{i}" for i in range(2)]
        try:
            lines = [Path("/etc/hosts").read_text()]
            for i in range(2):
                role, j = ("master", 0) if i == 0 else ("worker", i - 1)
                names = " ".join(n.format(i=i, role=role, j=j) for n in POD_NAMES)
                lines.append(f"{hosts.address(i)} {names}\n")
            for folder in etc:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text("".join(lines))
            yield hosts
        finally:
            for folder in etc:
                shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                etc[0].parent.rmdir()  # /etc/netns, where nothing else is left in it


@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_two_pods_form_one_world_from_the_operators_variables(
    pods: Hosts, tmp_path: Path, operator: str
) -> None:
    variables, expected = OPERATORS[operator]
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "GLOO_*", "NCCL_*", "PET_*",
            "JOB_COMPLETION_INDEX", *LAUNCHER_VARS]  # fmt: skip
    out = tmp_path / "state.{rank}.pt"
    procs, logs = [], []
    for i in range(2):
        env = worker_env(drop=drop, XDG_CONFIG_HOME=str(tmp_path / "xdg"), **variables(i))
        argv = pods.command(i, accel_command("launch", "--cpu", TRAIN, "ddp", out))
        logs.append(tmp_path / f"pod{i}.log")
        with logs[-1].open("w") as log:
            procs.append(
                subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
            )
    deadline = time.monotonic() + TIMEOUT
    try:
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    texts = [log.read_text() for log in logs]
    for i, (code, text) in enumerate(zip(codes, texts)):
        assert code == 0, text[-4000:]
        assert f"accel: {expected.format(i=i)}\n" in text, text[-3000:]
    assert "preflight: ok: 2 host(s) agree" in texts[0], texts[0][-3000:]
    states = [torch.load(str(out).format(rank=r)) for r in range(2)]
    assert [s["world"] for s in states] == [2, 2]
    for key, value in states[0]["state"].items():
        assert torch.equal(value, states[1]["state"][key]), key
    net = train.make_net()
    error = float32_error(3, train.GLOBAL_BATCH, norm_terms(list(net.parameters())))
    assert_same_training(
        states[0]["state"], train.reference(), net.state_dict(), bound=train.STEPS * error
    )
