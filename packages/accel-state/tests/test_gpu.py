"""accel-state on a CUDA GPU: the device registry's cuda entry answers as torch.cuda does, and
the hang doctor's report carries NCCL's Flight Recorder dump of the collectives it watched.

The Flight Recorder runs in a fresh spawned process (one rank, an NCCL process group on
device 0), so its environment variable is read by a ProcessGroupNCCL made after it is set.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest
import torch

from accel_state import DistributedType, device_entry
from accel_state.testing import run_distributed

pytestmark = pytest.mark.gpu


def test_the_cuda_entry_answers_as_torch_cuda_does() -> None:
    entry = device_entry("cuda:0")
    assert entry is device_entry(torch.device("cuda")) and entry.name == "cuda"
    assert entry.is_available() and entry.device_count() == torch.cuda.device_count()
    assert entry.module() is torch.cuda
    assert entry.default_backend() == "nccl"
    assert entry.distributed_type(1) == DistributedType.NO
    assert entry.distributed_type(2) == DistributedType.MULTI_GPU
    last = torch.cuda.device_count() - 1
    assert entry.device_for_rank(last, 2) == torch.device("cuda", last)
    before = torch.cuda.current_device()
    try:
        entry.set_device(torch.device("cuda", last))
        assert torch.cuda.current_device() == last
        assert entry.device_for_rank(0, 1) == torch.device("cuda", last)  # one process: current
    finally:
        torch.cuda.set_device(before)
    device = torch.device("cuda", 0)
    assert entry.device_name(device) == torch.cuda.get_device_name(device)
    assert entry.total_memory(device) == torch.cuda.get_device_properties(device).total_memory
    assert entry.tf32_matmul() == torch.backends.cuda.matmul.allow_tf32


def test_the_cuda_entry_synchronizes_and_counts_the_caching_allocator() -> None:
    entry = device_entry("cuda")
    device = torch.device("cuda", 0)
    entry.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # 64 MiB, 512-B aligned
    assert entry.memory_allocated(device) == torch.cuda.memory_allocated(device) == start + 2**26
    assert entry.max_memory_allocated(device) == torch.cuda.max_memory_allocated(device)
    assert entry.max_memory_reserved(device) == torch.cuda.max_memory_reserved(device)
    del block
    assert entry.max_memory_allocated(device) >= start + 2**26  # the peak outlives the block
    cached = torch.cuda.memory_reserved(device)  # the freed block stays in its own segment
    entry.empty_cache()
    assert torch.cuda.memory_reserved(device) <= cached - 2**26
    entry.reset_peak_memory_stats(device)
    assert entry.max_memory_allocated(device) == torch.cuda.memory_allocated(device)
    # a queued kernel long enough to be still running when the call returns
    a = torch.randn(4096, 4096, device=device)
    done = torch.cuda.Event()
    for _ in range(20):
        a = a @ a / 64
    done.record()
    entry.synchronize(device)
    assert done.query()


def test_the_cuda_entry_seeds_and_restores_the_generators() -> None:
    entry = device_entry("cuda")
    assert entry.rng_key == "torch_cuda_manual_seed"
    entry.manual_seed_all(1234)
    state = entry.get_rng_state()
    assert torch.equal(state, torch.cuda.get_rng_state())
    first = torch.rand(8, device="cuda")
    entry.set_rng_state(state)
    assert torch.equal(torch.rand(8, device="cuda"), first)
    every = entry.get_rng_state_all()
    assert len(every) == torch.cuda.device_count()
    torch.rand(8, device="cuda")
    entry.set_rng_state_all(every)
    assert torch.equal(torch.rand(8, device="cuda"), first)
    torch.cuda.manual_seed_all(1234)
    assert torch.equal(torch.rand(8, device="cuda"), first)  # the entry seeded as torch does


REDUCES = 3


def _hang_report_with_flight_recorder(folder: str) -> dict:
    import torch.distributed as dist

    from accel_state._record import recorded
    from accel_state.hang import HangDoctor

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    doctor = HangDoctor(0.5, rank=0, world_size=1, folder=folder, exit_process=False).start()
    try:
        t = torch.ones(4, device="cuda")
        for _ in range(REDUCES):
            # how accel's collectives enter the ring (one rank's own never call NCCL)
            recorded("all_reduce", t, lambda: dist.all_reduce(t))
            doctor.beat()
        torch.cuda.synchronize()
        deadline = time.monotonic() + 30
        while doctor.diagnosis is None and time.monotonic() < deadline:
            time.sleep(0.05)  # no beat: the step runs past the timeout, the report is written
    finally:
        doctor.stop()
    report = json.loads((Path(folder) / "rank0.json").read_text())
    trace = report["nccl_trace"]
    entries = []
    if Path(trace).is_file():
        entries = pickle.loads(Path(trace).read_bytes()).get("entries", [])
    dist.destroy_process_group()
    return {
        "trace": trace,
        "ops": [c["op"] for c in report["collectives"]],
        "names": [str(e.get("profiling_name", "")) for e in entries],
        "value": t.cpu(),
    }


def test_the_hang_report_holds_nccls_flight_recorder_dump(tmp_path: Path) -> None:
    (r,) = run_distributed(
        _hang_report_with_flight_recorder,
        str(tmp_path),
        world_size=1,
        timeout=180,
        env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
    )
    assert r["trace"] == str(tmp_path.resolve() / "rank0.nccl_trace.pkl"), r["trace"]
    assert r["ops"] == ["all_reduce"] * REDUCES, r["ops"]
    assert sum("all_reduce" in name for name in r["names"]) >= REDUCES, r["names"]
    assert torch.equal(r["value"], torch.ones(4))  # one rank: a sum is the tensor itself
