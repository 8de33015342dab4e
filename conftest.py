"""Fixtures every test of the workspace gets: a test must not leak state into the next one.

A test that leaves an environment variable changed, a process group alive, or a
PartialState behind fails (the state is reset for the next test either way).
"""

from __future__ import annotations

import collections
import compileall
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Variables that libraries set for themselves on first use (pytest; torch when it first
# imports torch._dynamo / inductor): not a leak of the test that happened to trigger them.
_SET_BY_LIBRARIES = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
# torch-xla sets these when its runtime starts (the XLA tests, on PJRT_DEVICE=CPU)
_SET_BY_LIBRARIES |= {
    "GRPC_VERBOSITY",
    "PJRT_DYNAMIC_PLUGINS",
    "SKIP_MEGASCALE_PJRT_CLIENT",
    "TF_CPP_MIN_LOG_LEVEL",
    "XLA_FLAGS",
    "XLA_USE_SPMD",  # the last: set by torch_xla.runtime.use_spmd()
}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the workspace's own sources to bytecode once, before any worker starts.

    The workspace packages are installed editable, so `uv sync` compiles only the libraries;
    where PYTHONDONTWRITEBYTECODE is set (as on CI), every spawned worker would otherwise
    compile accel's sources again (~0.1 s of CPU per `import accel`). Up-to-date files are
    skipped, so a second session costs a stat per file.
    """
    root = Path(__file__).parent
    for folder in ("packages", "integration-tests"):
        compileall.compile_dir(root / folder, quiet=2)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest -n the workers' collection order is the order of the run
    (`_serial_modules_first`): xdist must not sort the modules again.

    On XLA's CPU device (CI's torch-xla lane), start torch-xla's runtime before any test
    runs a backward: torch's autograd engine sizes its per-device queues at the first backward
    of the process, and an XLA device that appears after that fails every XLA backward."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    _one_extensions_folder()
    if os.environ.get("PJRT_DEVICE") == "CPU" and importlib.util.find_spec("torch_xla"):
        import torch_xla
        import torch_xla.runtime as xr

        if int(os.environ.get("CPU_NUM_DEVICES", "1")) > 1:
            # several virtual devices serve SPMD (test_xla_spmd.py): its mode comes first
            xr.use_spmd()
        torch_xla.device()


def _one_extensions_folder() -> None:
    """Every process of the session builds DeepSpeed's CPU ops (the shm communicator, CPU Adam)
    into one folder per Python and torch version, through one compile cache that a clone at a
    new path hits too (accel_testkit.extensions), both set here before any worker starts: a test
    that reaches DeepSpeed without asking for them (accelerate's suite, a client library, a
    launched script) would otherwise compile them again, a minute of CPU each, and a process
    with another CXX would rebuild the folder's ops for the others in turn."""
    if (
        importlib.util.find_spec("torch") is None
        or importlib.util.find_spec("accel_testkit") is None
    ):
        return
    from accel_testkit.extensions import extension_env

    for name, value in extension_env().items():
        os.environ.setdefault(name, value)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_torch_version_sensitive(config, items)
    _serial_modules_first(items)
    try:
        import torch
    except ImportError:  # a package installed alone without torch (accel-tracking): no GPU
        torch = None
    if os.environ.get("PJRT_DEVICE") != "TPU":
        tpu = pytest.mark.skip(
            reason="needs several XLA replicas (a TPU host, PJRT_DEVICE=TPU): XLA's CPU device "
            "runs one replica per process in CI (torch-xla's rendezvous hangs with more)"
        )
        for item in items:
            if "tpu" in item.keywords:
                item.add_marker(tpu)
    if torch is not None and torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- the torch-version lane (.ci/run's second lane, torch 2.9 + torch-xla 2.9) --------------------
# The modules whose behaviour can differ with torch's version: `pytest -m torch_version_sensitive`
# runs them, and CI's torch 2.9 lane runs only them (every test still runs on the main lane). The
# rule: a module is listed when what it checks is torch's own distributed or compiler machinery
# as accel drives it (DDP and gloo's collectives, every registered engine's contract loop, DCP,
# FSDP2 and DTensor, meshes and tensor parallel, pipelining,
# torch.compile/dynamo, fake process groups and the memory trace, torchrun and its elastic
# agent), an engine that branches on torch's version itself (DeepSpeed, torch-xla, torchao,
# accelerate's and transformers' suites, peft), or code of accel's with a torch-version branch
# (`_pipeline_torch`, `_parallelism_config`'s flattened meshes, `_memory_trace`, `_torchrun`,
# `accel_bigmodel._header`'s dtypes, `accel_state`'s TCPStore keys). A module that checks only
# accel's own logic (config parsing, loaders, trackers, big-model offload, launch flags, hangs)
# is not listed.
TORCH_VERSION_SENSITIVE = {
    # FSDP2, DTensor, DeviceMesh, tensor parallel, DCP
    "packages/accel/tests/test_fsdp.py": "FSDP2 (fully_shard) and its DTensor state dicts",
    "packages/accel/tests/test_mesh.py": "DeviceMesh, DTensor, tensor parallel, DCP",
    "packages/accel/tests/test_accelerate_checkpoints.py": "FSDP's and DeepSpeed's checkpoints",
    "packages/accel/tests/test_store_checkpoints.py": "DCP sharded saves and torch's FsspecReader",
    "packages/accel-parallel/tests/test_fsdp_plugin.py": "the FSDP plugin onto torch's FSDP2",
    "packages/accel-parallel/tests/test_parallelism_config.py": (
        "meshes flattened again after a new process group (torch 2.9's mesh table)"
    ),
    "packages/accel-cli/tests/test_merge_weights.py": "DCP checkpoints merged into one file",
    "packages/accel-parallel/tests/test_dcp_planners.py": "DCP's planners against accel's",
    # DDP and gloo's collectives, under every registered engine
    "packages/accel/tests/test_accelerator_ddp.py": "DDP and its communication hooks",
    "packages/accel-parallel/tests/test_contract.py": "every registered engine through one loop",
    "packages/accel-state/tests/test_collectives.py": "gloo collectives over nested data",
    # pipelining
    "packages/accel/tests/test_pipeline.py": "torch.distributed.pipelining, mend_pipeline_stage",
    "packages/accel-parallel/tests/test_pipeline_plan.py": "pipelining's split of a model",
    # fake process groups and the memory trace
    "packages/accel-parallel/tests/test_memory.py": "fake collectives, Meta kernels of c10d",
    "packages/accel-parallel/tests/test_memory_shard.py": "FSDP2's chunking helper and the memory tracker's peak update, replaced during the estimate",
    "packages/accel-cli/tests/test_estimate_train.py": "the memory estimate under FSDP/TP",
    # torch.compile / dynamo
    "packages/accel/tests/test_accelerator.py": "dynamo_backend: torch.compile of the model",
    "packages/accel/tests/test_familiar_distributed.py": "unwrap of a dynamo OptimizedModule",
    "packages/accel/tests/test_import_cost.py": "measured against `import torch`'s own imports",
    # torchrun and its elastic agent
    "packages/accel-cli/tests/test_slurm_and_stop.py": "torchrun's SIGTERM handler (_torchrun)",
    "packages/accel-cli/tests/test_elastic_launch.py": "torchrun's elastic agent",
    # DeepSpeed (which branches on torch's version)
    "packages/accel/tests/test_deepspeed.py": "DeepSpeed ZeRO, CPU Adam",
    "packages/accel/tests/test_deepspeed_sequence_parallel.py": "DeepSpeed's sequence parallel",
    "packages/accel/tests/test_gathered_parameters.py": "DeepSpeed's gathered parameters",
    "packages/accel/tests/test_memory_zero.py": "DeepSpeed ZeRO's memory",
    "packages/accel-parallel/tests/test_deepspeed_fill.py": "DeepSpeed's config filled in",
    "packages/accel-parallel/tests/test_deepspeed_reshard.py": "DeepSpeed checkpoints resharded",
    "packages/accel-cli/tests/test_deepspeed_launch.py": "DeepSpeed's launcher",
    # torch-xla (runs on torch 2.9 only): the lane's XLA runs are separate (.ci/run)
    "packages/accel/tests/test_xla.py": "torch-xla",
    "packages/accel/tests/test_xla_launchers.py": "torch-xla's launcher",
    "packages/accel/tests/test_xla_spmd.py": "torch-xla's SPMD",
    "packages/accel-cli/tests/test_xla_launch.py": "torch-xla's launcher from accel launch",
    "integration-tests/test_xla_launch.py": "torch-xla's launcher",
    # torchao, peft, transformers (the lane installs the releases made for its torch)
    "packages/accel-bigmodel/tests/test_quantization_torchao.py": "torchao",
    "packages/accel-precision/tests/test_fp8.py": "torchao's float8",
    "packages/accel/tests/test_quantized_clients.py": "transformers' quantizers, torchao, peft",
    "packages/accel/tests/test_clients.py": "transformers' Trainer and peft on accel",
    "packages/accel/tests/test_client_matrix.py": "transformers' and peft's paths by torch",
    # accelerate's own suite (require_torch_min_version, is_torch_version)
    "integration-tests/test_accelerate_suite.py": "accelerate's suite branches on torch",
    # accel's code with a torch-version branch
    "packages/accel-bigmodel/tests/test_header.py": "the dtypes torch has (_header.DTYPES)",
    "packages/accel-state/tests/test_restart_store.py": "TCPStore.list_keys by torch version",
}


def _mark_torch_version_sensitive(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    stale = [path for path in TORCH_VERSION_SENSITIVE if not (root / path).is_file()]
    if stale:
        raise pytest.UsageError(f"conftest.TORCH_VERSION_SENSITIVE names no file: {stale}")
    mark = pytest.mark.torch_version_sensitive
    for item in items:
        if item.nodeid.split("::")[0] in TORCH_VERSION_SENSITIVE:
            item.add_marker(mark)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.needs("accel_parallel", ...)`: a test that reaches a sibling package or
    an optional library skips, naming what is missing, where its package is installed alone
    (.ci/run); in the workspace everything is there and it runs."""
    for mark in item.iter_markers("needs"):
        missing = [name for name in mark.args if importlib.util.find_spec(name) is None]
        if missing:
            pytest.skip(f"needs {', '.join(missing)}, which is not installed here")


@pytest.fixture(autouse=True)
def _no_leaks():
    before = dict(os.environ)
    yield
    problems = []
    after = dict(os.environ)
    changed = sorted(
        k
        for k in set(before) | set(after)
        if before.get(k) != after.get(k) and k not in _SET_BY_LIBRARIES
    )
    if changed:
        problems.append(f"environment variables changed: {changed}")
        os.environ.clear()
        os.environ.update(before)
    try:
        import torch.distributed as dist
    except ImportError:  # installed alone without torch: no process group to leak
        dist = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        problems.append("a process group was left initialized")
        dist.destroy_process_group()
    try:
        from accel_state import PartialState
    except ImportError:  # a package installed alone, without accel-state
        PartialState = None
    if PartialState is not None and PartialState._topology is not None:
        PartialState._reset_state()
    if problems:
        pytest.fail("test leaked state: " + "; ".join(problems))


# -- a real S3 server (moto's) for the object-store tests ----------------------------------------
@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[Any]:
    """moto's S3 server on loopback, one per test process (accel_testkit.s3.S3Server)."""
    from accel_testkit.s3 import s3_server

    with s3_server() as server:
        yield server


@pytest.fixture
def s3(s3_endpoint: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh bucket (its s3:// URL), with this process's AWS environment pointing at the
    server for the test's duration; `s3_endpoint.env` is that environment for subprocesses."""
    name = "t-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:20]
    url = s3_endpoint.bucket(name)
    with s3_endpoint.environment():
        yield url


# -- the machine shared between pytest-xdist's workers (`pytest -n N`, CI) -----------------------
# A module marked `serial` (hang timeouts, heartbeats, cut links: its verdicts depend on its
# processes getting the CPU in time) runs alone: its worker takes the machine exclusively, the
# other workers' modules share it. Two file locks in the workers' common folder: `turn` lets a
# serial module go ahead of modules that have not started yet (no starving it), `share` is held
# shared by every running module and exclusively by a serial one. Without xdist: nothing.


def _serial_modules_first(items: list[pytest.Item]) -> None:
    """Under pytest -n, hand out the serial modules first, one after another, then the others,
    the longest first (`_module_seconds`).

    A serial module met midway waits until every module running beside it has ended, and
    the workers that finish meanwhile wait too: in CI that drained the machine once per serial
    module (setups waiting 100-200 s). Run back to back at the start, they wait for nothing.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    module_of = {id(item): item.nodeid.split("::")[0] for item in items}
    counts = collections.Counter(module_of.values())
    serial = {module_of[id(i)] for i in items if i.get_closest_marker("serial") is not None}
    seconds = _module_seconds()

    def order(item: pytest.Item) -> tuple:
        module = module_of[id(item)]
        return (module not in serial, -seconds.get(module, 0.0), -counts[module])

    items.sort(key=order)


def _module_seconds() -> dict[str, float]:
    """The seconds each module ran in a measured run (MODULE_SECONDS): the longest are handed
    out first, so no long module starts last and runs on alone while the other workers idle
    (test_estimate_train.py, 5 tests and 140 s, went out near the end by its test count). A
    module not listed comes after them, most tests first; a missing file orders by count."""
    try:
        return json.loads(MODULE_SECONDS.read_text())
    except FileNotFoundError:
        return {}


@pytest.fixture(scope="module", autouse=True)
def _machine_share(request: pytest.FixtureRequest) -> Iterator[None]:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    folder = request.getfixturevalue("tmp_path_factory").getbasetemp().parent
    serial = request.node.get_closest_marker("serial") is not None
    asked = time.time()
    with open(folder / "machine.turn", "a") as turn, open(folder / "machine.share", "a") as share:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if serial:
            fcntl.flock(share, fcntl.LOCK_EX)  # waits for the running modules to end
        else:
            fcntl.flock(share, fcntl.LOCK_SH)
            fcntl.flock(turn, fcntl.LOCK_UN)
        started = time.time()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(share, fcntl.LOCK_UN)
                fcntl.flock(turn, fcntl.LOCK_UN)
            _record_module_time(request.node.nodeid, asked, started, time.time())


MODULE_SECONDS = Path(__file__).parent / ".ci" / "module_seconds.json"


def _record_module_time(module: str, asked: float, started: float, ended: float) -> None:
    """With ACCEL_MODULE_TIMES=FILE, each module's line of the run's timeline: the worker, the
    module, when it asked for the machine, started and ended (seconds since the epoch). The
    waits tell how long the serial modules held the others back; `.ci/module_seconds.py FILE`
    turns the lines into MODULE_SECONDS, the hint that hands out the longest modules first."""
    path = os.environ.get("ACCEL_MODULE_TIMES")
    if not path:
        return
    line = f"{os.environ.get('PYTEST_XDIST_WORKER')}\t{module}\t{asked:.3f}\t{started:.3f}\t{ended:.3f}\n"
    with open(path, "a") as f:  # one short append per module: whole lines from every worker
        f.write(line)
