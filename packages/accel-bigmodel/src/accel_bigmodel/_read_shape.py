"""How the fault-in threads read cold shards: how many threads, in runs of how many bytes.

The fastest shape depends on the disk and on what else the machine is doing: on the
development VM 8 threads x 8 MiB, fixed before, was the best of a sweep on one day and
1.3-1.5x slower than the best on others; in sweeps of 2-16 threads x 8-32 MiB since, 32 MiB
runs were the fastest or within 10% of it every time, and the best thread count moved between
4, 8 and 16. So the run length is fixed at 32 MiB and the thread count is measured where it
runs. The first cold load from a device in a process reads its first bytes (which it needs
anyway) with each candidate in turn (twice, see `Probe`), keeps the fastest for the rest of
that load, and every later load from that device in the process starts with it. A load too
small to pay for the probe (`MIN_PROBED_SHARE` times `probe_bytes()`) uses `DEFAULT` and leaves
the choice to a larger one. An explicit ``CheckpointReader(threads=...)`` is used as given, in
runs of `EXPLICIT_CHUNK`.
"""

from __future__ import annotations

import math
import mmap
import os
import threading

MiB = 2**20
# Candidates in the order tried; on a tie (within `TIE`) the earlier, fewer threads, wins.
CANDIDATES: tuple[tuple[int, int], ...] = ((4, 32 * MiB), (8, 32 * MiB))
DEFAULT = (8, 32 * MiB)
EXPLICIT_CHUNK = 8 * MiB
ROUNDS = 1  # rounds of runs (threads x chunk bytes) per visit; two visits per candidate
WARM_BYTES = 32 * MiB  # read first with `DEFAULT`, unmeasured: the disk ramps up
MIN_PROBED_SHARE = 1.5  # probe only a load at least this many times the probe's bytes
TIE = 0.05

_chosen: dict[int, tuple[int, int]] = {}  # device -> shape, for this process
_lock = threading.Lock()


def pace_for(path: str, total: int, threads: int | None, chunk: int | None) -> Fixed | Probe:
    """The pace for faulting `total` bytes of `path`'s device in (`threads`/`chunk` if given)."""
    if threads is not None or chunk is not None:
        return Fixed(threads or DEFAULT[0], chunk or EXPLICIT_CHUNK)
    try:
        device = os.stat(path).st_dev
    except OSError:
        return Fixed(*DEFAULT)
    with _lock:
        known = _chosen.get(device)
    if known is not None:
        return Fixed(*known)
    if total < MIN_PROBED_SHARE * probe_bytes():
        return Fixed(*DEFAULT)
    return Probe(device)


def probe_bytes() -> int:
    """The bytes a probe reads before it chooses (the warm-up and every candidate)."""
    return WARM_BYTES + 2 * sum(ROUNDS * threads * chunk for threads, chunk in CANDIDATES)


def chosen_shapes() -> dict[int, tuple[int, int]]:
    """The shape chosen so far for each device (st_dev), in this process."""
    with _lock:
        return dict(_chosen)


def forget_shapes() -> None:
    """Measure again at the next cold load (for tests and benchmarks)."""
    with _lock:
        _chosen.clear()


class Fixed:
    """One shape throughout."""

    def __init__(self, threads: int, chunk: int) -> None:
        self.max_threads = max(1, threads)
        self._chunk = _pages(chunk)

    def limit(self) -> int:
        return self.max_threads

    def chunk(self) -> int:
        return self._chunk

    def handed(self, nbytes: int) -> int | None:
        return None

    def record(self, tag: int | None, nbytes: int, started: float, ended: float) -> None:
        pass


class Probe:
    """Each candidate in turn, twice, then the fastest; the choice is remembered.

    After a warm-up with `DEFAULT`, the candidates are visited in the order A B C C B A (with
    two, A B B A), one round of runs (threads x chunk) per visit, so a rate that drifts while the load runs (the
    disk ramping up, other work on the machine) weighs on every candidate alike. A visit's
    runs start together and the next visit starts when they have all finished, so each visit
    is timed alone, from its first run's start to its last run's end; a candidate's rate is
    the bytes of its two visits over their summed time. The pauses between visits (while a
    visit's last run finishes) and the slower candidates' visits are what the probe costs.
    """

    def __init__(self, device: int) -> None:
        self._device = device
        self.max_threads = max(t for t, _ in (*CANDIDATES, DEFAULT))
        count = len(CANDIDATES)
        self._steps = [-1, *range(count), *reversed(range(count))]  # -1: the warm-up
        self._step = 0
        self._handed = 0  # bytes handed out in this step
        self._closed = False  # this step's bytes are all handed out; waiting for its runs
        self._pending = 0  # this step's runs not finished yet
        self._span = [0, math.inf, 0.0]  # this step: bytes, first start, last end
        self._totals = [[0, 0.0] for _ in CANDIDATES]  # bytes, seconds of each candidate
        self._final: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def _shape(self) -> tuple[int, int]:
        if self._final is not None:
            return self._final
        k = self._steps[self._step]
        return DEFAULT if k < 0 else CANDIDATES[k]

    def limit(self) -> int:
        """How many runs may be in flight now (none while a visit's last runs finish)."""
        with self._lock:
            return 0 if self._closed else self._shape()[0]

    def chunk(self) -> int:
        """The longest run to hand out next."""
        with self._lock:
            return _pages(self._shape()[1])

    def handed(self, nbytes: int) -> int | None:
        """A run of `nbytes` was handed out; its tag for `record` (None: not measured)."""
        with self._lock:
            if self._final is not None:
                return None
            threads, chunk = self._shape()
            self._handed += nbytes
            self._pending += 1
            warming = self._steps[self._step] < 0
            self._closed = self._handed >= (WARM_BYTES if warming else ROUNDS * threads * chunk)
            return self._step

    def record(self, tag: int | None, nbytes: int, started: float, ended: float) -> None:
        if tag is None:
            return
        with self._lock:
            span = self._span
            span[0] += nbytes
            span[1], span[2] = min(span[1], started), max(span[2], ended)
            self._pending -= 1
            if not (self._closed and not self._pending):
                return
            k = self._steps[self._step]
            if k >= 0:
                self._totals[k][0] += span[0]
                self._totals[k][1] += span[2] - span[1]
            self._span, self._handed, self._closed = [0, math.inf, 0.0], 0, False
            self._step += 1
            if self._step == len(self._steps):
                self._final = self._best()
                with _lock:
                    _chosen.setdefault(self._device, self._final)

    def rates(self) -> list[float]:
        """Bytes per second of each candidate over its finished visits (0 where none)."""
        return [nbytes / seconds if seconds else 0.0 for nbytes, seconds in self._totals]

    def _best(self) -> tuple[int, int]:
        """The fastest candidate; one within `TIE` of it that comes earlier (fewer threads)
        wins."""
        rates = self.rates()
        top = max(rates)
        if not top:
            return DEFAULT
        return CANDIDATES[next(k for k, rate in enumerate(rates) if rate >= top * (1 - TIE))]


def _pages(nbytes: int) -> int:
    return max(mmap.PAGESIZE, nbytes - nbytes % mmap.PAGESIZE)
