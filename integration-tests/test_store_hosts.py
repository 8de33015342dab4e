"""Hosts that share no filesystem, checkpoints only in an object store.

Three hosts (tools/netns: a network namespace each) with a filesystem each of their own as
well (`private=True`: / read-only, /tmp a tmpfs that only that host sees, kept between its
commands), and moto's S3 server on the switch at 10.213.0.2, which the hosts reach over their
cluster link. Two hosts train DDP and FSDP2 (one process each, `accel launch --num_machines 2`)
and save the state at step SAVE_AT into the store; the run is then resumed from the store (a)
on the same two hosts, (b) on one host with one process (world 2 -> 1, resharded), (c) on
host 2, which never saw the first run, with two processes. Every result is read from the
store: each resumed run's data position and final weights equal the uninterrupted run's.
DDP names its checkpoints with ProjectConfiguration(project_dir="s3://...",
automatic_checkpoint_naming=True) and resumes with load_state_if_any; FSDP2 saves and loads
explicit URLs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from accel_testkit.launch import LAUNCHER_VARS, accel_command, worker_env
from accel_testkit.netns import Hosts, hosts_or_skip
from accel_testkit.tolerance import assert_same_training, float32_error, norm_terms

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "_store_train.py"
PORT, STORE_PORT = 29500, 9000
BUCKET = "accel-runs"
SAVE_AT = 3
TIMEOUT = 150
pytestmark = [pytest.mark.slow, pytest.mark.serial]

sys.path.insert(0, str(HERE))
try:
    import _store_train as train
finally:
    sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Hosts, dict[str, str]]]:
    """The hosts, each with its own filesystem, and the store on the switch: (hosts, the
    environment a host's process needs to use the store)."""
    pytest.importorskip("moto.server", reason="moto[server] (the workspace's dev group)")
    pytest.importorskip("s3fs", reason="s3fs (the s3 extra)")
    name = f"accst{os.getpid() % 100000}"
    with hosts_or_skip(name, 3, private=True) as hosts, hosts.store(STORE_PORT) as s3:
        _on_switch(hosts, s3.env, f"import s3fs; s3fs.S3FileSystem().mkdir({BUCKET!r})")
        yield hosts, s3.env


def _on_switch(hosts: Hosts, store_env: dict[str, str], code: str, *args: object) -> str:
    """Python `code` run on the switch, the one seat that reaches the store and this
    machine's files (the test process reaches neither the hosts nor the store)."""
    argv = hosts.switch_command([sys.executable, "-c", code, *args])
    done = subprocess.run(
        argv, env={**os.environ, **store_env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _fetch(hosts: Hosts, store_env: dict[str, str], url: str, dest: Path) -> dict[str, Any]:
    """A result the run wrote into the store, copied here through the switch and loaded."""
    code = (
        "import sys, pathlib; from accel_bigmodel import stores; "
        "pathlib.Path(sys.argv[2]).write_bytes(stores.read_bytes(sys.argv[1]))"
    )
    _on_switch(hosts, store_env, code, url, dest)
    return torch.load(dest)


def _store_files(hosts: Hosts, store_env: dict[str, str], url: str) -> list[str]:
    code = "import sys; from accel_bigmodel import stores; print(*stores.files_under(sys.argv[1]), sep='\\n')"
    return _on_switch(hosts, store_env, code, url).split()


def _on_host(hosts: Hosts, i: int, argv: Sequence[object]) -> str:
    done = subprocess.run(
        hosts.command(i, argv, private=True), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Launches:
    """`accel launch` started on several hosts at once, each in its own filesystem; each
    one's output in a log of the test's (the log is an open file handed down, which the
    host writes without seeing the test's files)."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env, self.procs, self.logs = tmp, env, [], []

    def start(self, hosts: Hosts, host: int, args: Sequence[object]) -> None:
        log = self.tmp / f"host{host}.{len(self.logs)}.log"
        argv = hosts.command(host, accel_command("launch", *args), private=True)
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv, env=self.env, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append(proc)
        self.logs.append(log)

    def wait(self, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        try:
            for proc, log in zip(self.procs, self.logs):
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                assert code == 0, log.read_text()[-4000:]
        finally:
            for proc in self.procs:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)


def _flags(hosts: Hosts, rank: int, machines: int, processes: int) -> list[object]:
    """`processes` per machine (accel's --num_processes is the total)."""
    if machines == 1:
        return ["--cpu", "--num_processes", processes]
    return [
        "--cpu", "--num_processes", processes * machines, "--num_machines", machines,
        "--machine_rank", rank, "--main_process_ip", hosts.address(0),
        "--main_process_port", PORT,
    ]  # fmt: skip


def _train(
    cluster: tuple[Hosts, dict[str, str]],
    tmp: Path,
    engine: str,
    out: str,
    on: Sequence[int],
    processes: int,
    extra: Sequence[object],
) -> dict[str, Any]:
    """One run of _store_train.py on hosts `on` (`processes` each); its result, from the
    store."""
    hosts, store_env = cluster
    drop = ["ACCEL_*", "SLURM_*", "TORCHELASTIC_*", "GLOO_*", "NCCL_*", "AWS_*", *LAUNCHER_VARS]
    runs = Launches(tmp, worker_env(drop=drop, **store_env))
    run = f"s3://{BUCKET}/{engine}"
    naming = ["--auto"] if engine == "ddp" else []
    for rank, host in enumerate(on):
        flags = _flags(hosts, rank, len(on), processes)
        runs.start(hosts, host, [*flags, TRAIN, engine, run, out, *naming, *extra])
    runs.wait()
    return _fetch(hosts, store_env, f"{run}/{out}.pt", tmp / f"{out}.pt")


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def first(
    request: pytest.FixtureRequest,
    cluster: tuple[Hosts, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, dict[str, Any]]:
    """The uninterrupted run on hosts 0 and 1, which saves its state at step SAVE_AT and
    trains on to the end: (engine, its result)."""
    engine = request.param
    tmp = tmp_path_factory.mktemp(f"first-{engine}")
    result = _train(cluster, tmp, engine, "full", [0, 1], 1, ["--save_at", SAVE_AT])
    assert result["world"] == 2 and result["start"] == 0 and result["resumed"] is None
    assert sorted(result["batches"]) == list(range(1, train.STEPS + 1))
    assert str(result["saved"]).startswith(f"s3://{BUCKET}/{engine}/"), result["saved"]
    return engine, result


def _resume(
    cluster: tuple[Hosts, dict[str, str]],
    first: tuple[str, dict[str, Any]],
    tmp: Path,
    out: str,
    on: Sequence[int],
    processes: int,
) -> dict[str, Any]:
    engine, full = first
    resume = [] if engine == "ddp" else ["--resume", f"s3://{BUCKET}/{engine}/step{SAVE_AT}"]
    got = _train(cluster, tmp, engine, out, on, processes, resume)
    assert got["resumed"] == full["saved"], (got["resumed"], full["saved"])
    assert got["start"] == SAVE_AT and got["world"] == len(on) * processes
    # the data position came back exactly: every later step drew the same samples
    assert got["batches"] == {k: v for k, v in full["batches"].items() if k > SAVE_AT}
    _nothing_local(cluster[0], got, on)
    return got


def _nothing_local(hosts: Hosts, result: dict[str, Any], on: Sequence[int]) -> None:
    """The run's files are in the store and on its hosts' own /tmp only: no folder named
    after the URL on any host, no staging folder of an upload or download left in a host's
    /tmp, and what a host wrote in its working directory is not seen from here."""
    assert not any("s3:" in p for p in result["local"]), result["local"]
    for i in on:
        assert _on_host(hosts, i, ["find", "/tmp", "-name", "*s3:*"]) == ""
        staged = ["find", "/tmp", "-maxdepth", "1", "-name", "accel-*load-*"]
        assert _on_host(hosts, i, staged) == ""
        mine = _on_host(hosts, i, ["ls", "/tmp/work"]).split()
        assert any(name.startswith("ran-") for name in mine), mine
        assert not any(Path(result["cwd"], name).exists() for name in mine)
    assert not list(Path.cwd().glob("s3:*"))


def _same_as_full(first: tuple[str, dict[str, Any]], got: dict[str, Any]) -> None:
    """Bit for bit where the resumed run's arithmetic is the uninterrupted run's (as many
    processes, each summing the same samples in the same order); else within float32
    rounding: the steps after SAVE_AT summed their batch in another order (one process's
    mean of 16 samples, not the mean of two processes' means of 8)."""
    _, full = first
    if got["world"] == full["world"]:
        for key, value in full["state"].items():
            assert torch.equal(got["state"][key], value), key
        return
    net = train.make_net()
    error = float32_error(train.LAYERS, train.GLOBAL_BATCH, norm_terms(list(net.parameters())))
    bound = (train.STEPS - SAVE_AT) * error
    assert_same_training(got["state"], full["state"], net.state_dict(), bound=bound)


def test_hosts_share_no_filesystem_but_reach_the_store(
    cluster: tuple[Hosts, dict[str, str]], tmp_path: Path
) -> None:
    """What the other tests stand on: a file a host writes in its /tmp is there for its next
    command only, / is read-only to it, and the store answers it over the cluster network."""
    hosts, store_env = cluster
    mark = f"mark-{os.getpid()}"
    _on_host(hosts, 0, ["sh", "-c", f"echo h0 > /tmp/work/{mark}"])
    assert _on_host(hosts, 0, ["cat", f"/tmp/work/{mark}"]).strip() == "h0"
    assert _on_host(hosts, 0, ["pwd"]).strip() == "/tmp/work"
    assert _on_host(hosts, 0, ["sh", "-c", "echo $HOME"]).strip() == "/tmp/home"
    for other in (1, 2):
        assert mark not in _on_host(hosts, other, ["ls", "-a", "/tmp/work"]).split()
    assert not Path("/tmp/work", mark).exists()
    # the test's own /tmp is out of sight, the repository (the code it runs) read-only
    (tmp_path / "here").write_text("test")
    probe = ["sh", "-c", f"ls {tmp_path} 2>&1; touch {HERE}/x 2>&1; true"]
    seen = _on_host(hosts, 1, probe)
    assert "No such file or directory" in seen and "Read-only file system" in seen, seen
    assert not (HERE / "x").exists()
    code = (
        "from accel_bigmodel import stores; "
        f"stores.write_bytes('s3://{BUCKET}/probe/h1', b'from h1'); "
        f"print(stores.read_bytes('s3://{BUCKET}/probe/h1').decode())"
    )
    env = {**os.environ, **store_env}
    done = subprocess.run(
        hosts.command(1, [sys.executable, "-c", code], private=True),
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "from h1", done.stderr[-2000:]
    assert _store_files(hosts, store_env, f"s3://{BUCKET}/probe") == ["h1"]


def test_the_checkpoint_is_in_the_store_only(
    cluster: tuple[Hosts, dict[str, str]], first: tuple[str, dict[str, Any]]
) -> None:
    hosts, store_env = cluster
    engine, full = first
    files = _store_files(hosts, store_env, full["saved"])
    assert files, f"nothing under {full['saved']}"
    _nothing_local(hosts, full, [0, 1])
    # the test process sees none of the hosts' /tmp/work
    assert full["cwd"] == "/tmp/work"
    assert not Path(full["cwd"], "ran-full-rank0").exists()


def test_resume_on_the_same_two_hosts(
    cluster: tuple[Hosts, dict[str, str]], first: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    got = _resume(cluster, first, tmp_path, "same-hosts", [0, 1], 1)
    _same_as_full(first, got)


def test_resume_on_one_host_world_2_to_1(
    cluster: tuple[Hosts, dict[str, str]], first: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    got = _resume(cluster, first, tmp_path, "one-host", [1], 1)
    _same_as_full(first, got)


def test_resume_on_a_host_that_never_saw_the_run(
    cluster: tuple[Hosts, dict[str, str]], first: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    hosts, _ = cluster
    engine, _ = first
    # host 2 holds nothing of this engine's first run (its /tmp is its own)
    assert not [n for n in _on_host(hosts, 2, ["ls", "/tmp/work"]).split() if "full" in n]
    got = _resume(cluster, first, tmp_path, "new-host", [2], 2)
    _same_as_full(first, got)
