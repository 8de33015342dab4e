"""The fault-in shape: given, or measured on the first cold load from a device and remembered."""

import itertools
import mmap
import os
import sys

import pytest
import torch
from safetensors.torch import save_file

from accel_bigmodel import _read_shape
from accel_bigmodel._fault_in import FaultIn, map_file
from accel_bigmodel._header import read_header
from accel_bigmodel._read_shape import Fixed, Probe, pace_for

MiB = 2**20
A, B, C = (2, 2 * MiB), (4, MiB), (8, MiB)


@pytest.fixture
def small_probe(monkeypatch):
    """Candidates and quotas small enough for a test file; nothing chosen before."""
    monkeypatch.setattr(_read_shape, "CANDIDATES", (A, B, C))
    monkeypatch.setattr(_read_shape, "DEFAULT", B)
    monkeypatch.setattr(_read_shape, "ROUNDS", 1)
    monkeypatch.setattr(_read_shape, "WARM_BYTES", 2 * MiB)
    monkeypatch.setattr(_read_shape, "MIN_PROBED_SHARE", 1)
    _read_shape.forget_shapes()
    yield
    _read_shape.forget_shapes()


def _drive(pace: Probe, seconds_per_mib: dict) -> list[tuple[int, int]]:
    """Hand out runs one after another, each taking the time its shape's rate says."""
    now, shapes = 0.0, []
    while pace._final is None:
        threads, chunk = pace.limit(), pace.chunk()
        tag = pace.handed(chunk)
        shapes.append((threads, chunk))
        took = seconds_per_mib[(threads, chunk)] * chunk / MiB
        pace.record(tag, chunk, now, now + took)
        now += took
    return shapes


def test_the_fastest_candidate_is_chosen_and_remembered_for_the_device(small_probe, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    device = os.stat(path).st_dev
    pace = pace_for(str(path), 64 * MiB, None, None)
    assert isinstance(pace, Probe) and pace.max_threads == 8
    shapes = _drive(pace, {A: 1.0, B: 0.5, C: 0.7})  # seconds per MiB, with all its threads
    assert shapes[:2] == [B, B]  # warming up with the default (2 MiB), unmeasured
    visits = [k for k, _ in itertools.groupby(shapes[2:])]
    assert visits == [A, B, C, B, A]  # each candidate twice (C's visits adjoin)
    rates = pace.rates()
    assert rates[1] == max(rates)
    assert _read_shape.chosen_shapes() == {device: B}
    assert (pace.limit(), pace.chunk(), pace.handed(B[1])) == (*B, None)
    again = pace_for(str(path), 64 * MiB, None, None)  # the next load: no probe
    assert isinstance(again, Fixed) and (again.limit(), again.chunk()) == B


def test_a_tie_goes_to_fewer_threads(small_probe, tmp_path):
    pace = pace_for(str(tmp_path), 64 * MiB, None, None)
    _drive(pace, {A: 0.50, B: 0.49, C: 0.5})  # B is 2% faster than A: within the tie
    assert list(_read_shape.chosen_shapes().values()) == [A]


def test_given_threads_small_loads_and_unknown_files_do_not_probe(small_probe, tmp_path):
    given = pace_for(str(tmp_path), 10**12, 3, None)
    assert isinstance(given, Fixed) and given.limit() == 3
    assert (given.chunk(), given.handed(MiB)) == (_read_shape.EXPLICIT_CHUNK, None)
    assert _read_shape.probe_bytes() == (2 + 2 * (4 + 4 + 8)) * MiB
    small = pace_for(str(tmp_path), 30 * MiB, None, None)  # below the 34 MiB of a probe
    assert isinstance(small, Fixed) and (small.limit(), small.chunk()) == B
    missing = pace_for(str(tmp_path / "gone"), 10**12, None, None)
    assert isinstance(missing, Fixed)
    assert _read_shape.chosen_shapes() == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="maps are Linux's")
def test_fault_in_with_a_probe_brings_everything_in_with_each_shape(
    small_probe, tmp_path, monkeypatch
):
    torch.manual_seed(0)
    state = {f"w{k:02d}": torch.randn(MiB // 4 * (1 + k % 3)) for k in range(24)}  # 48 MiB
    path = str(tmp_path / "model.safetensors")
    save_file(state, path)
    infos = read_header(path)
    mapped = map_file(path)
    timed: list[tuple[int, float, float]] = []
    record = Probe.record

    def logged(self, tag, nbytes, started, ended):
        timed.append((tag, started, ended))
        record(self, tag, nbytes, started, ended)

    monkeypatch.setattr(Probe, "record", logged)
    fault_in = FaultIn([(path, mapped, i.offset, i.nbytes) for i in infos])
    fault_in.join()
    steps = sorted({tag for tag, _, _ in timed if tag is not None})
    assert steps == list(range(7))  # the warm-up and six visits
    for step in steps[1:]:  # each starts once the one before has finished: timed alone
        before = max(end for tag, _, end in timed if tag == step - 1)
        assert min(start for tag, start, _ in timed if tag == step) >= before
    assert sorted(fault_in.order) == list(range(len(infos)))
    chunks = [end - begin for _, begin, end, _ in fault_in._jobs]
    assert max(chunks) <= 2 * MiB + MiB // 2  # a run takes a short tail (< chunk / 4) along
    assert all(begin % mmap.PAGESIZE == 0 for _, begin, _, _ in fault_in._jobs)
    assert {B[1], A[1]} <= set(chunks)  # the warm-up, and each candidate's runs
    assert list(_read_shape.chosen_shapes()) == [os.stat(path).st_dev]
    for k, info in enumerate(infos):
        fault_in.wait(k)
        got = torch.frombuffer(mapped, dtype=info.dtype, count=info.nbytes // 4, offset=info.offset)
        assert torch.equal(got, state[info.name])
