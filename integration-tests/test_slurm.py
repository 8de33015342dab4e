"""accel under a real SLURM cluster: a controller and two slurmd nodes on loopback
(tools/slurm/cluster.sh), real sbatch / srun / scancel / scontrol, real processes.

- srun without a launcher forms one gloo group with SLURM's ranks, local ranks and nodes;
- DDP under srun ends with the weights of one process taking the same global batch;
- `srun accel launch` on one node and on two nodes, with no machine flags;
- a one-process program (python or `accel launch`) in the batch script of a job of several
  tasks is a world of 1 and does not wait for ranks that never come;
- preemption with USR1 and with TERM (`scancel --signal`): the launcher exits 75, the job
  script of the README requeues itself, and the rerun resumes to the weights of a run that
  was never stopped.

The cluster is found through $ACCEL_SLURM_ENV or /tmp/accel-slurm/env (written by
`tools/slurm/cluster.sh start`); when it is not up but SLURM and munge are installed, the
tests start it themselves (and stop it at the end). Without SLURM they skip, saying so.
The jobs run concurrently: the whole module costs about as much as its longest job.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from accel_cli._run import STOPPED_EXIT_CODE
from accel_state.testing import free_port
from accel_testkit.launch import LAUNCHER_VARS, accel_command, launch_command, worker_env

pytestmark = pytest.mark.serial  # timeouts: runs alone under pytest -n (conftest.py)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "_slurm_worker.py"
CLUSTER = REPO / "tools" / "slurm" / "cluster.sh"
ENV_FILE = Path(os.environ.get("ACCEL_SLURM_ENV", "/tmp/accel-slurm/env"))
TIMEOUT = 600  # for all the jobs; each command of a job script has its own timeout
COMMAND_TIMEOUT = 150  # a command that hangs ends with 124 and fails its own test
WAIT_AT = 4  # the micro-step at which the preempted runs wait for their signal
_DAEMONS = ("slurmctld", "slurmd", "munged", "srun", "sbatch")
_TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
             "BOOT_FAIL", "DEADLINE", "PREEMPTED"}  # fmt: skip


def _read_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        if name and value:
            out[name.strip()] = value.strip().strip("'\"")
    return out


def _answers(env: dict[str, str]) -> bool:
    try:
        done = subprocess.run(["sinfo", "-h"], env=env, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment jobs are submitted with: this one without launcher or accel
    variables, plus the cluster's SLURM_CONF, one thread per process and no user config."""
    base = worker_env(
        drop=["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "PMI_*", "OMPI_*", *LAUNCHER_VARS],
        XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("xdg")),
    )
    started = False
    if not (ENV_FILE.is_file() and _answers({**base, **_read_env_file(ENV_FILE)})):
        missing = [d for d in _DAEMONS if shutil.which(d) is None]
        if missing:
            pytest.skip(
                f"no SLURM cluster: none answers through {ENV_FILE}, and {', '.join(missing)} "
                f"not installed to start one; run `tools/slurm/cluster.sh start` (as root it "
                f"installs slurm-wlm and munge with apt)"
            )
        cluster_dir = {"ACCEL_SLURM_DIR": str(ENV_FILE.parent)}
        done = subprocess.run(["bash", str(CLUSTER), "start"], env={**base, **cluster_dir},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"tools/slurm/cluster.sh start failed:\n{done.stderr[-3000:]}")
        started = True
    env = {**base, **_read_env_file(ENV_FILE)}
    yield env
    if started:
        subprocess.run(["bash", str(CLUSTER), "stop"], env={**base, **cluster_dir},
                       capture_output=True, timeout=120)  # fmt: skip


def _python(*args: object) -> list[str]:
    return [sys.executable, *(str(a) for a in args)]


def _srun(options: str, argv: list[str]) -> str:
    return f"srun {options} {shlex.join(argv)}"


def _record(name: str, command: str | list[str]) -> str:
    """A job-script line running `command` with a timeout, its output and exit code kept."""
    command = command if isinstance(command, str) else shlex.join(command)
    return (
        f'timeout {COMMAND_TIMEOUT} {command} > "$OUT/{name}.log" 2>&1; echo $? > "$OUT/{name}.rc"'
    )


def _sbatch(env: dict[str, str], out: Path, name: str, options: str, lines: list[str]) -> str:
    script = out / f"{name}.sh"
    script.write_text("\n".join(["#!/bin/bash", f"#SBATCH {options}", f'OUT="{out}"', *lines]))
    done = subprocess.run(
        ["sbatch", "--parsable", "-J", name, "-o", str(out / f"{name}-%j.out"), str(script)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _job_state(env: dict[str, str], job: str) -> str:
    done = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN")


def _wait_for(
    what: Callable[[], bool], description: str, env: dict[str, str], jobs: list[str]
) -> None:
    """Poll `what` until it holds; past TIMEOUT cancel the jobs and fail."""
    deadline = time.monotonic() + TIMEOUT
    while not what():
        if time.monotonic() > deadline:
            for job in jobs:
                subprocess.run(["scancel", job], env=env, timeout=60)
            pytest.fail(f"timed out waiting for {description} (jobs {jobs} cancelled)")
        time.sleep(0.2)


def _ready_or_over(env: dict[str, str], job: str, ready: Path) -> bool:
    return ready.exists() or _job_state(env, job) in _TERMINAL


def _done(env: dict[str, str], jobs: list[str]) -> None:
    _wait_for(lambda: all(_job_state(env, j) in _TERMINAL for j in jobs), "the jobs", env, jobs)


def _output(out: Path, name: str) -> str:
    logs = sorted(out.glob(f"{name}*.out")) + sorted(out.glob(f"{name}*.log"))
    return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in logs)


@pytest.fixture(scope="module")
def runs(slurm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every job of the module, submitted at once; returns the folder holding their files.

    - `one_node` (sbatch -N1 --ntasks=2): in the batch script, a one-process python run and a
      one-process `accel launch`; srun -n2 without a launcher, and DDP on two tasks against
      one process (the batch script itself) on the same global batch;
    - `two_nodes` (sbatch -N2 --ntasks-per-node=1): in the batch script, the same one-process
      runs; srun over both nodes without a launcher; `srun accel launch` over one node and
      over two;
    - `usr1`, `term`: the README's requeue recipe, signalled once the workers wait at
      micro-step WAIT_AT; `reference`: the same training never stopped (no SLURM).
    """
    env, out = slurm_env, tmp_path_factory.mktemp("slurm")
    for folder in ("ddp1", "ddp2", "reference"):
        (out / folder).mkdir()
    jobs = {
        "one_node": _sbatch(env, out, "one_node", "-N1 --ntasks=2", [
            _record("batch_python", _python(WORKER, "topology", out, "batch_python")),
            _record("batch_launch", accel_command("launch", WORKER, "topology", out,
                                                  "batch_launch")),
            _record("ddp1", _python(WORKER, "ddp", out / "ddp1")),
            _record("ddp2", _srun("-n2", _python(WORKER, "ddp", out / "ddp2"))),
            _record("srun_n2", _srun("-N1 -n2", _python(WORKER, "topology", out, "srun_n2"))),
        ]),
        "two_nodes": _sbatch(env, out, "two_nodes", "-N2 --ntasks-per-node=1", [
            _record("batch2_python", _python(WORKER, "topology", out, "batch2_python")),
            _record("batch2_launch", accel_command("launch", WORKER, "topology", out,
                                                   "batch2_launch")),
            _record("srun_N2", _srun("-N2 -n2", _python(WORKER, "topology", out, "srun_N2"))),
            _record("launch_N1", _srun("-N1 -n1", launch_command(
                WORKER, "topology", out, "launch_N1"))),
            _record("launch_N2", _srun("-N2 --ntasks-per-node=1", launch_command(
                "--main_process_port", free_port(), WORKER, "topology", out, "launch_N2",
                num_processes=4))),
        ]),
    }  # fmt: skip
    for sig in ("usr1", "term"):
        project = out / sig
        project.mkdir()
        train = launch_command(WORKER, "train", project, "--wait_at", WAIT_AT)
        jobs[sig] = _sbatch(env, out, sig, "-N1 --ntasks=1 --requeue", [
            # The README's recipe, with the launcher's exit code kept for each attempt.
            _srun("", train),
            f'rc=$?; echo $rc > "$OUT/{sig}/exit_${{SLURM_RESTART_COUNT:-0}}"',
            'if [ $rc -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
        ])  # fmt: skip
    with open(out / "reference.log", "w") as log:
        reference = subprocess.Popen(
            launch_command(WORKER, "train", out / "reference"),
            env={k: v for k, v in env.items() if k != "SLURM_CONF"}, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        for sig in ("usr1", "term"):
            ready = out / sig / "ready"
            waiting = functools.partial(_ready_or_over, env, jobs[sig], ready)
            _wait_for(waiting, f"the {sig} job's workers to reach step {WAIT_AT}", env,
                      list(jobs.values()))  # fmt: skip
            assert ready.exists(), f"the {sig} job ended before its workers waited:\n" + _output(
                out, sig
            )
            subprocess.run(["scancel", f"--signal={sig.upper()}", jobs[sig]], env=env,
                           check=True, timeout=60)  # fmt: skip
        _done(env, list(jobs.values()))
        reference.wait(timeout=TIMEOUT)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert reference.returncode == 0, _output(out, "reference")
    return out


def _rc(out: Path, name: str) -> int:
    return int((out / f"{name}.rc").read_text())


def _records(out: Path, tag: str, world: int) -> list[dict]:
    files = sorted(out.glob(f"{tag}_*.json"))
    assert len(files) == world, (files, _output(out, tag))
    return [
        json.loads(p.read_text()) for p in sorted(files, key=lambda p: int(p.stem[len(tag) + 1 :]))
    ]


def test_srun_without_a_launcher_forms_one_group(runs: Path) -> None:
    for name, shape in (("srun_n2", "one node"), ("srun_N2", "two nodes")):
        assert _rc(runs, name) == 0, _output(runs, name)
        got = _records(runs, name, 2)
        assert [r["launcher"] for r in got] == ["slurm", "slurm"], shape
        assert [(r["rank"], r["world"], r["sum"]) for r in got] == [(0, 2, 3.0), (1, 2, 3.0)]
    one = _records(runs, "srun_n2", 2)
    assert [(r["local_rank"], r["local_world"], r["node_rank"]) for r in one] == [
        (0, 2, 0), (1, 2, 0)]  # fmt: skip
    two = _records(runs, "srun_N2", 2)
    assert [(r["local_rank"], r["local_world"], r["node_rank"]) for r in two] == [
        (0, 1, 0), (0, 1, 1)]  # fmt: skip
    assert two[0]["node"] != two[1]["node"]


def test_ddp_under_srun_equals_one_process_on_the_global_batch(runs: Path) -> None:
    assert _rc(runs, "ddp1") == 0 and _rc(runs, "ddp2") == 0, _output(runs, "ddp")
    one = torch.load(runs / "ddp1" / "weights.pt", weights_only=True)
    two = torch.load(runs / "ddp2" / "weights.pt", weights_only=True)
    assert (one["world"], two["world"]) == (1, 2)
    # Each step's gradient is the same sum of 8 per-sample terms t_i, added in another order
    # (4 + 4 on two ranks, then the all-reduce of the 2 halves; scaling by 1/2, 1/4, 1/8 is
    # exact). Float32 sums of n terms are within (n-1)u sum|t_i| of the exact sum, u = 2^-24,
    # so the two gradients differ by at most 2 * 7u * sum|t_i|, and the forward's 4-term dot
    # products add as much again: 2 * 16u * sum|t_i| covers both. SGD moves the weights by lr
    # times that per step, and on this least-squares problem (lr * largest curvature < 1) it
    # does not amplify an earlier difference, so the bound adds up over the steps.
    tolerance = one["lr"] * 2 * 16 * 2.0**-24 * one["scale"]
    for name, value in one["weights"].items():
        diff = (two["weights"][name] - value).abs().max().item()
        assert diff <= tolerance, (name, diff, tolerance)


def test_accel_launch_under_srun_on_one_and_two_nodes(runs: Path) -> None:
    assert _rc(runs, "launch_N1") == 0, _output(runs, "launch_N1")
    one = _records(runs, "launch_N1", 2)
    assert [(r["launcher"], r["world"], r["local_world"], r["node_rank"]) for r in one] == [
        ("torchrun", 2, 2, 0)] * 2  # fmt: skip
    assert _rc(runs, "launch_N2") == 0, _output(runs, "launch_N2")
    two = _records(runs, "launch_N2", 4)
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["sum"]) for r in two] == [
        (0, 0, 0, 10.0), (1, 1, 0, 10.0), (2, 0, 1, 10.0), (3, 1, 1, 10.0)]  # fmt: skip
    assert {r["node"] for r in two[:2]} != {r["node"] for r in two[2:]}


def test_one_process_in_a_batch_script_of_several_tasks_is_alone(runs: Path) -> None:
    # sbatch --ntasks=2 and --nodes=2 give the batch script SLURM_PROCID=0 and
    # SLURM_NTASKS=2, but no step id: one process, as with accelerate.
    for name in ("batch_python", "batch_launch", "batch2_python", "batch2_launch"):
        assert _rc(runs, name) == 0, _output(runs, name)  # 124 would be the timeout: a hang
        (record,) = _records(runs, name, 1)
        assert (record["launcher"], record["world"], record["rank"]) == ("none", 1, 0), name


@pytest.mark.parametrize("sig", ["usr1", "term"])
def test_preemption_requeue_resumes_to_the_unbroken_weights(runs: Path, sig: str) -> None:
    project = runs / sig
    output = _output(runs, sig)
    assert (project / "exit_0").read_text().strip() == str(STOPPED_EXIT_CODE), output
    assert (project / "exit_1").read_text().strip() == "0", output
    steps = {(project / f"stopped_{r}").read_text() for r in (0, 1)}
    assert steps == {str(WAIT_AT)}, steps  # both ranks stopped at the step they waited at
    for rank in (0, 1):
        assert json.loads((project / f"resumed_0_{rank}").read_text()) == [None, 0]
        where, step = json.loads((project / f"resumed_1_{rank}").read_text())
        assert where is not None and step == WAIT_AT
    expected = load_file(runs / "reference" / "final" / "model.safetensors")
    got = load_file(project / "final" / "model.safetensors")
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


def test_term_to_every_process_of_a_step_exits_with_the_stopped_code(tmp_path: Path) -> None:
    """What SLURM does on scancel, preemption or the time limit, without SLURM: SIGTERM to
    the launcher, torchrun and the workers at once. torchrun must not turn it into a failure
    when the workers saved and returned."""
    project = tmp_path / "run"
    env = worker_env(drop=["ACCEL_*", "SLURM_*"], XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    argv = launch_command(WORKER, "train", project, "--wait_at", WAIT_AT)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (project / "ready").exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the workers never reached their step"
            time.sleep(0.1)
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for member in tree:
            member.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=TIMEOUT)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == STOPPED_EXIT_CODE, output[-3000:]
    assert {(project / f"stopped_{r}").read_text() for r in (0, 1)} == {str(WAIT_AT)}
