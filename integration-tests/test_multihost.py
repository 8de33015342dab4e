"""Several machines for real: every host is a network namespace of its own (tools/netns), with
its own loopback, a dead first interface (eth0) and the cluster network (eth1), and runs its
own `accel launch --num_machines N --machine_rank i --main_process_ip <host 0>`.

What loopback hides is real here: the machine's host name resolves to 127.0.0.1, so gloo left
to itself advertises loopback to the other hosts; the first interface reaches nobody. The
launches train DDP, FSDP2 and DeepSpeed ZeRO-2 equal to one process of plain PyTorch; the
preflight names each planted mistake before any worker starts; a host whose link is cut
mid-collective is named by the hang doctor of the survivors.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from accel_testkit.launch import LAUNCHER_VARS, accel_command, launch_command, worker_env
from accel_testkit.netns import Hosts, hosts_or_skip
from accel_testkit.tolerance import assert_same_training, float32_error, norm_terms

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "_multihost_train.py"
HANG = HERE / "_multihost_hang.py"
SLURM_CLUSTER = HERE.parent / "tools" / "slurm" / "cluster.sh"
PORT = 29500
TIMEOUT = 180
PREFLIGHT_EXIT_CODE = 78  # accel_cli._preflight.PREFLIGHT_EXIT_CODE
HANG_EXIT_CODE = 86
pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with hosts_or_skip(f"accel{os.getpid() % 100000}", 3) as made:
        yield made


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "GLOO_*", "NCCL_*", *LAUNCHER_VARS]
    return worker_env(drop=drop, XDG_CONFIG_HOME=str(tmp / "xdg"), **extra)


def _flags(hosts: Hosts, rank: int, machines: int = 2, processes: int = 2) -> list[object]:
    return [
        "--cpu", "--num_processes", processes, "--num_machines", machines,
        "--machine_rank", rank, "--main_process_ip", hosts.address(0),
        "--main_process_port", PORT,
    ]  # fmt: skip


class Launches:
    """`accel launch` started on several hosts at once; each one's output in its own log."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs, self.logs = tmp, [], []

    def start(self, hosts: Hosts, host: int, args: Sequence[object], env: dict[str, str]) -> None:
        log = self.tmp / f"host{host}.{len(self.logs)}.log"
        argv = hosts.command(host, accel_command("launch", *args))
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        self.logs.append(log)

    def wait(self, timeout: float = TIMEOUT) -> list[tuple[int, str]]:
        deadline = time.monotonic() + timeout
        out = []
        try:
            for proc, log in zip(self.procs, self.logs):
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                out.append((code, log.read_text()))
        finally:
            self.kill()
        return out

    def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _all_ok(results: list[tuple[int, str]]) -> None:
    for code, log in results:
        assert code == 0, log[-4000:]


# -- training across hosts ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("engine", "rdzv"), [("ddp", "static"), ("fsdp2", "c10d"), ("zero2", "static")]
)
def test_two_hosts_train_equal_to_one_process(
    hosts: Hosts, tmp_path: Path, engine: str, rdzv: str
) -> None:
    """2 hosts x 1 process; gloo is left to pick its interface by accel alone (GLOO_*
    unset), so the run only forms when accel chooses eth1, the route to host 0."""
    sys.path.insert(0, str(HERE))
    try:
        import _multihost_train as train
    finally:
        sys.path.remove(str(HERE))
    out = tmp_path / "state.pt"
    env = _env(tmp_path)
    runs = Launches(tmp_path)
    for rank in (0, 1):
        flags = _flags(hosts, rank)
        if rdzv != "static":
            flags += ["--rdzv_backend", rdzv]
        runs.start(hosts, rank, [*flags, TRAIN, engine, out], env)
    results = runs.wait()
    _all_ok(results)
    assert "preflight: ok: 2 host(s) agree" in results[0][1], results[0][1][-3000:]
    saved = torch.load(out)
    assert saved["world"] == 2 and saved["gloo"] == "eth1"
    net = train.make_net()
    params = [p for p in net.parameters()]
    # a step's gradients over 16 samples through 3 layers of <= 16 terms, the clip's norm
    error = float32_error(3, train.GLOBAL_BATCH, norm_terms(params))
    assert_same_training(
        saved["state"], train.reference(), net.state_dict(), bound=train.STEPS * error
    )


# -- the preflight: each planted mistake named before any worker starts -------------------------
def _preflight(hosts: Hosts, tmp: Path, plans: list[tuple[int, list[object], dict]]) -> list:
    """Start one launch per (host, extra flags, extra env), in the order given; each runs the
    training script only if its preflight passes."""
    runs = Launches(tmp)
    for host, flags, extra in plans:
        runs.start(hosts, host, [*flags, TRAIN, "ddp", tmp / "never.pt"], _env(tmp, **extra))
    return runs.wait(timeout=120)


def test_preflight_names_a_machine_rank_given_twice(hosts: Hosts, tmp_path: Path) -> None:
    # the two claimants of rank 1 start first, so both are there when machine 0 listens
    results = _preflight(hosts, tmp_path, [
        (1, _flags(hosts, 1), {}), (2, _flags(hosts, 1), {}), (0, _flags(hosts, 0), {}),
    ])  # fmt: skip
    for code, log in results:
        assert code == PREFLIGHT_EXIT_CODE, log
        assert "machine_rank 1: claimed by 2 hosts" in log, log
        assert f"at {hosts.address(1)}" in log and f"at {hosts.address(2)}" in log, log
    assert not (tmp_path / "never.pt").exists()


def test_preflight_names_a_held_port_on_both_sides(hosts: Hosts, tmp_path: Path) -> None:
    holder = subprocess.Popen(hosts.command(0, [sys.executable, "-c", (
        "import socket,time;s=socket.socket();"
        "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"  # past earlier tests' TIME_WAIT
        f"s.bind(('0.0.0.0',{PORT}));s.listen();"
        "print('held',flush=True);time.sleep(120)"
    )]), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        results = _preflight(
            hosts, tmp_path, [(0, _flags(hosts, 0), {}), (1, _flags(hosts, 1), {})]
        )
    finally:
        holder.kill()
        holder.wait()
    (code0, log0), (code1, log1) = results
    assert code0 == PREFLIGHT_EXIT_CODE and f"main_process_port {PORT} is already held" in log0, (
        log0
    )
    assert f"(pid {holder.pid}" in log0, log0
    assert code1 == PREFLIGHT_EXIT_CODE, log1
    assert "something other than machine 0's `accel launch` answers" in log1, log1


def test_preflight_names_an_unreachable_main_address(hosts: Hosts, tmp_path: Path) -> None:
    nobody, unrouted = "10.213.0.99", "10.77.0.1"  # on the cluster network / on no network
    plans = []
    for ip in (nobody, unrouted):
        flags = _flags(hosts, 1)
        flags[flags.index("--main_process_ip") + 1] = ip
        plans.append((1, flags, {}))
    (code_a, log_a), (code_b, log_b) = _preflight(hosts, tmp_path, plans)
    assert code_a == PREFLIGHT_EXIT_CODE and f"no host answers at main_process_ip {nobody}" in log_a
    assert code_b == PREFLIGHT_EXIT_CODE and f"{unrouted} ({unrouted}) is not reachable" in log_b
    assert "eth1 10.213.0.11" in log_b, log_b  # the host's own interfaces are listed


def test_preflight_compares_the_world_and_the_training_settings(
    hosts: Hosts, tmp_path: Path
) -> None:
    # a world that cannot form: fatal on both hosts, the two values side by side
    results = _preflight(hosts, tmp_path, [
        (0, _flags(hosts, 0), {}), (1, _flags(hosts, 1, processes=4), {}),
    ])  # fmt: skip
    for code, log in results:
        assert code == PREFLIGHT_EXIT_CODE, log
        assert "num_processes=2" in log and "num_processes=4" in log, log
    # a training setting: a warning naming both values; --dry_run prints every host's command
    runs = Launches(tmp_path)
    for rank, precision in ((0, "no"), (1, "bf16")):
        flags = [*_flags(hosts, rank), "--mixed_precision", precision, "--preflight", "--dry_run"]
        runs.start(hosts, rank, [*flags, TRAIN, "ddp", "x"], _env(tmp_path))
    for code, log in runs.wait(timeout=120):
        assert code == 0, log
        assert "warning: hosts disagree" in log and "mixed_precision=bf16" in log, log
        assert "# machine 0:" in log and "# machine 1:" in log and "--local-addr" in log, log
        assert "GLOO_SOCKET_IFNAME=eth1" in log, log
    # ... and an error with --preflight strict
    runs = Launches(tmp_path)
    for rank, precision in ((0, "no"), (1, "bf16")):
        flags = [*_flags(hosts, rank), "--mixed_precision", precision, "--preflight", "strict"]
        runs.start(hosts, rank, [*flags, TRAIN, "ddp", tmp_path / "never.pt"], _env(tmp_path))
    for code, log in runs.wait(timeout=120):
        assert code == PREFLIGHT_EXIT_CODE and "mixed_precision=no" in log, log


def test_preflight_names_an_interface_that_cannot_reach_machine_0(
    hosts: Hosts, tmp_path: Path
) -> None:
    wait = ["--preflight_timeout", "8"]
    results = _preflight(hosts, tmp_path, [
        (0, [*_flags(hosts, 0), *wait], {}),
        (1, [*_flags(hosts, 1), *wait], {"GLOO_SOCKET_IFNAME": "eth0"}),  # the dead network
        (2, [*_flags(hosts, 1), *wait], {"GLOO_SOCKET_IFNAME": "eth7"}),  # no such interface
    ])  # fmt: skip
    (code0, log0), (code1, log1), (code2, log2) = results
    assert code1 == PREFLIGHT_EXIT_CODE, log1
    assert f"interface chosen for the run's traffic ({hosts.dead_address(1)})" in log1, log1
    assert "set them to eth1" in log1, log1
    assert code2 == PREFLIGHT_EXIT_CODE and "GLOO_SOCKET_IFNAME=eth7 names no interface" in log2
    # machine 0 saw nobody come and says which rank is missing
    assert code0 == PREFLIGHT_EXIT_CODE and "machine_rank 1 never arrived" in log0, log0


def test_preflight_names_the_world_of_one_trap(hosts: Hosts, tmp_path: Path) -> None:
    """`--main_process_ip localhost` on every machine: each machine's loopback is its own."""
    plans = []
    for rank in (0, 1):
        flags = [*_flags(hosts, rank), "--preflight_timeout", "5"]
        flags[flags.index("--main_process_ip") + 1] = "127.0.0.1"
        plans.append((rank, flags, {}))
    (code0, log0), (code1, log1) = _preflight(hosts, tmp_path, plans)
    for code, log in ((code0, log0), (code1, log1)):
        assert code == PREFLIGHT_EXIT_CODE, log
        assert "main_process_ip 127.0.0.1 is a loopback address" in log, log
    assert "machine_rank 1 never arrived" in log0, log0


# -- a host lost while the others wait in a collective ------------------------------------------
@pytest.mark.parametrize("how", ["link_cut", "killed"])
def test_hang_doctor_names_the_lost_host(hosts: Hosts, tmp_path: Path, how: str) -> None:
    hang_timeout = 4
    ready = tmp_path / "ready"
    env = _env(tmp_path)
    runs = Launches(tmp_path)
    for rank in (0, 1):
        flags = [*_flags(hosts, rank), "--hang_timeout", hang_timeout]
        runs.start(hosts, rank, [*flags, HANG, ready], env)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists():
            assert runs.procs[0].poll() is None, runs.logs[0].read_text()[-3000:]
            assert time.monotonic() < deadline, "the ranks never met"
            time.sleep(0.05)
        if how == "link_cut":
            hosts.cut(1)
        else:
            hosts.kill(1)
        # the guard against a hang; how soon the survivor ends is bench_multihost.py's figure
        # (a test asserts no wall-clock time: a loaded machine stretches every step)
        code = runs.procs[0].wait(timeout=hang_timeout + 90)
    finally:
        runs.kill()
        hosts.kill(1)
        hosts.mend(1)
    log = runs.logs[0].read_text()
    assert code == HANG_EXIT_CODE, log[-4000:]
    lost = f"host {hosts.address(1)} (rank 1)"
    if how == "link_cut":
        assert f"{lost} is lost: it does not answer on the network" in log, log[-4000:]
    else:
        assert f"{lost} answers on the network, but its processes wrote no report" in log, log
    assert "while rank 0" in log and "reduce #" in log and "_multihost_hang.py" in log, log


# -- elastic: a host's link cut mid-training, then the host back ---------------------------------
def test_elastic_run_survives_a_cut_link_and_takes_the_host_back(
    hosts: Hosts, tmp_path: Path
) -> None:
    """test_elastic.py's scenario on separate hosts, with host 1's link cut instead of its
    processes killed: host 0's worker is left waiting in a barrier that no error ends; the
    hang doctor ends it after --hang_timeout (15 s: above a resumed worker's first step on a
    loaded 2-core machine, which includes importing torch's compiler), torchrun restarts it, the rendezvous drops host
    1 (its heartbeats stopped) and the worker resumes alone from the newest checkpoint. At the
    checkpoint of step GROW host 1 comes back (link up, its launcher started again) and both
    resume on 2 processes. The weights equal a run that changed its processes on purpose."""
    sys.path.insert(0, str(HERE))
    try:
        import test_elastic as plain
    finally:
        sys.path.remove(str(HERE))
    env = _env(tmp_path, LOGLEVEL="INFO")
    elastic, reference = tmp_path / "elastic", tmp_path / "reference"
    shrink, grow = plain.SHRINK, plain.GROW
    holds = ["--hold", "1:0", "--hold", f"2:{shrink}", "--hold", f"1:{grow}"]
    script = [plain.SCRIPT, elastic, *holds]
    flags = [
        "--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", f"{hosts.address(0)}:{PORT}", "--max_restarts", "3",
        "--monitor_interval", "0.2", "--rdzv_conf", plain.RDZV_CONF, "--hang_timeout", "15",
    ]  # fmt: skip
    parts = [f"2:{shrink}", f"1:{grow}", "2:-1"]
    ref_log = tmp_path / "reference.log"
    with ref_log.open("w") as out:
        ref = subprocess.Popen(
            [sys.executable, str(plain.SCRIPT), str(reference), "--planned", *parts],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    runs = Launches(tmp_path)
    try:
        runs.start(hosts, 1, [*flags, *script], env)  # B first: A hosts the store (is_host)
        runs.start(hosts, 0, [*flags, *script], env)
        b, a = runs.procs
        plain._wait_for(f"the checkpoint of step {shrink}",
                        lambda: plain._complete(elastic, shrink), [a, b], runs.logs)  # fmt: skip
        hosts.cut(1)
        plain._wait_for(f"the checkpoint of step {grow}",
                        lambda: plain._complete(elastic, grow), [a], runs.logs[1:])  # fmt: skip
        hosts.kill(1)  # host 1 comes back: its link up, its launcher started again
        hosts.mend(1)
        runs.start(hosts, 1, [*flags, *script], env)
        for proc, log in zip(runs.procs[1:], runs.logs[1:]):
            assert proc.wait(timeout=TIMEOUT) == 0, log.read_text()[-5000:]
        assert ref.wait(timeout=TIMEOUT) == 0, ref_log.read_text()[-3000:]
    finally:
        runs.kill()
        hosts.kill(1)
        hosts.mend(1)
        if ref.poll() is None:
            ref.kill()
    log_a = runs.logs[1].read_text()
    assert f"host {hosts.address(1)} (rank 1) is lost" in log_a, log_a[-5000:]
    assert "the run recovered" in log_a, log_a[-3000:]

    def resumes(project: Path) -> list[tuple[int, int, int]]:
        starts = sorted(plain._starts(project), key=lambda s: (s["step"], s["rank"]))
        return [(s["world"], s["step"], s["rank"]) for s in starts if s["resumed"]]

    planned = [(1, shrink, 0), (2, grow, 0), (2, grow, 1)]
    assert resumes(elastic) == planned == resumes(reference), plain._starts(elastic)
    expected = plain.load_file(reference / "final" / "model.safetensors")
    got = plain.load_file(elastic / "final" / "model.safetensors")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


# -- SLURM: one slurmd per namespaced host --------------------------------------------------------
@pytest.fixture(scope="module")
def slurm_hosts(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A SLURM cluster whose two nodes are hosts 0 and 1 (tools/slurm/cluster.sh with
    ACCEL_SLURM_NETNS); the client commands run on host 0, where the controller is, through
    wrappers first on PATH (the job scripts' own `scontrol requeue` included)."""
    missing = [d for d in ("slurmctld", "slurmd", "munged", "nsenter") if shutil.which(d) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (tools/slurm/cluster.sh start installs "
                    f"slurm-wlm and munge with apt; .ci/run runs it)")  # fmt: skip
    folder = tmp_path_factory.mktemp("slurm-netns")
    cluster = {"ACCEL_SLURM_NETNS": hosts.name, "ACCEL_SLURM_DIR": str(folder / "cluster")}
    base = _env(folder)
    done = subprocess.run(["bash", str(SLURM_CLUSTER), "start"], env={**base, **cluster},
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"cluster.sh start with ACCEL_SLURM_NETNS failed:\n{done.stderr[-3000:]}")
    wrappers = folder / "bin"
    wrappers.mkdir()
    for name in ("sbatch", "squeue", "scontrol", "scancel", "sinfo"):
        path = wrappers / name
        path.write_text(f'#!/bin/sh\nexec nsenter --net=/var/run/netns/{hosts.name}-h0 '
                        f'{shutil.which(name)} "$@"\n')  # fmt: skip
        path.chmod(0o755)
    conf = str(folder / "cluster" / "slurm.conf")
    try:
        yield {**base, "SLURM_CONF": conf, "PATH": f"{wrappers}:{base['PATH']}", "out": folder}
    finally:
        subprocess.run(["bash", str(SLURM_CLUSTER), "stop"], env={**base, **cluster},
                       capture_output=True, timeout=120)  # fmt: skip


def test_slurm_job_on_two_namespaced_hosts_trains_and_requeues(slurm_hosts: dict) -> None:
    """sbatch -N2: `srun accel launch` with no machine flags takes the rendezvous to the first
    node of the job's node list (10.213.0.10) and the interface to it, and trains equal to one
    process; the README's requeue recipe stopped by USR1 resumes on both nodes to the weights
    of a run that was never stopped."""
    sys.path.insert(0, str(HERE))
    try:
        import _multihost_train as train
        import test_slurm as slurm
    finally:
        sys.path.remove(str(HERE))
    env = {k: v for k, v in slurm_hosts.items() if k != "out"}
    out: Path = slurm_hosts["out"]
    two = "-N2 --ntasks-per-node=1"
    launch = accel_command("launch", "--cpu", "--num_processes", "2")
    jobs = {"train": slurm._sbatch(env, out, "train", two, [
        slurm._record("train", slurm._srun(two, [*launch, str(TRAIN), "ddp", str(out / "state.pt")])),
    ])}  # fmt: skip
    project = out / "usr1"
    project.mkdir()
    jobs["usr1"] = slurm._sbatch(env, out, "usr1", f"{two} --requeue", [
        slurm._srun(two, [*launch, *map(str, (slurm.WORKER, "train", project, "--wait_at",
                                               slurm.WAIT_AT))]),
        f'rc=$?; echo $rc > "{project}/exit_${{SLURM_RESTART_COUNT:-0}}"',
        'if [ $rc -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
    ])  # fmt: skip
    local = {k: v for k, v in env.items() if k != "SLURM_CONF"}
    with open(out / "reference.log", "w") as log:
        reference = subprocess.Popen(launch_command(slurm.WORKER, "train", out / "reference"),
                                     env=local, stdout=log, stderr=log)  # fmt: skip
    try:
        ready = project / "ready"
        waiting = lambda: slurm._ready_or_over(env, jobs["usr1"], ready)  # noqa: E731
        slurm._wait_for(waiting, "the usr1 job's workers", env, list(jobs.values()))
        assert ready.exists(), slurm._output(out, "usr1")
        subprocess.run(["scancel", "--signal=USR1", jobs["usr1"]], env=env, check=True, timeout=60)
        slurm._done(env, list(jobs.values()))
        reference.wait(timeout=TIMEOUT)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    text = slurm._output(out, "train")
    assert (out / "train.rc").read_text().strip() == "0", text
    # the whole log: on exit torchrun's agents may log a long exit-barrier traceback after these
    whole = (out / "train.log").read_text()
    assert "(vm, 10.213.0.10)" in whole and "talking over eth1" in whole, text
    saved = torch.load(out / "state.pt")
    assert saved["world"] == 2 and saved["gloo"] == "eth1"
    net = train.make_net()
    error = float32_error(3, train.GLOBAL_BATCH, norm_terms(list(net.parameters())))
    assert_same_training(saved["state"], train.reference(), net.state_dict(), train.STEPS * error)
    usr1 = slurm._output(out, "usr1")
    assert (project / "exit_0").read_text().strip() == "75", usr1
    assert (project / "exit_1").read_text().strip() == "0", usr1
    expected = slurm.load_file(out / "reference" / "final" / "model.safetensors")
    got = slurm.load_file(project / "final" / "model.safetensors")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
