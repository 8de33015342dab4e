"""The hang doctor's watchdog: a daemon thread that notices a step or a collective running
past the timeout on this rank, tells every rank, and has each write its report before the
job ends with `HANG_EXIT_CODE`.

Ranks learn of a hang through the process group's TCPStore (which keeps answering while a
gloo collective hangs) and through a notice file in the report folder (which works when the
store's host is gone). Each rank writes `rank<k>.stack.txt` (faulthandler, all threads) and
`rank<k>.json` (the collective ring and the main thread's stack); then one diagnosis is
printed: by `accel launch` when it asked for the report (`notify` is set), else by rank 0
(or the lowest rank still alive).

Cost at N ranks. At the start each rank writes its machine's address to the store (one set;
N records in all). On a hang each rank writes its own report and waits for one file (the
collector's mark, polled every `_POLL_OTHERS` s). One rank collects: rank 0, or where rank 0
wrote nothing the lowest rank that wrote a report (a rank looks below itself for a report
until it finds one). The collector waits for the N reports (each file looked at until it
appears), reads the machines of the M ranks that wrote none in two store round trips (a
check and a multi_get of M keys), probes each of their machines once, and writes the
diagnosis: O(N) files and O(M) store keys in all, where every rank used to read all N keys.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

from accel_state import _ring, hosts
from accel_state._diagnosis import (
    DIAGNOSIS_FILE,
    brief,
    diagnose,
    load_reports,
    report_path,
    stack_path,
)

# The exit code of every rank (and of `accel launch`) after a diagnosed hang.
HANG_EXIT_CODE = 86
STORE_KEY = "accel_hang_doctor/notice"
HOST_KEY = "accel_hang_doctor/host"  # + "/<rank>": the address of the rank's machine
NOTICE_FILE = "NOTICE"
COLLECTED_FILE = "collected"  # the collector is done (with a launcher, which then diagnoses)
NOTICE_LOOKS_PER_SECOND = 4096
_POLL_OTHERS = 0.25  # how often a rank that does not collect looks for the collector's mark
_COLLECT_MARGIN = 2.0  # seconds beyond the collector's wait and probes, before taking over
_READ_SECONDS = 0.0005  # the collector's time to read one rank's report, at most
_STDLIB = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
_ACTIVE: HangDoctor | None = None  # the doctor watching this process


def active_doctor() -> HangDoctor | None:
    """The hang doctor watching this process, or None."""
    return _ACTIVE


def _sigterm_while_watched(_signum: int, _frame: Any) -> None:
    """SIGTERM's default action (the end of the process), held while a collective runs.

    A launcher ends every worker with SIGTERM as soon as one of them exits. When a rank is
    killed, the others are in a collective that is about to fail on the lost peer, and that
    failure is what their reports name; ended first by SIGTERM, they would write none. So a
    SIGTERM that arrives during a collective takes effect once it returned (a failure is
    reported, and the report ends the process); at any other time it ends the process at
    once, as it would without the doctor."""
    doctor = _ACTIVE
    if doctor is not None:
        if doctor._report_ends_process():
            return
        if doctor.ring.in_call:
            doctor._sigterm_pending = True
            return
    _terminate_by_sigterm()


# accel's stop handlers (Accelerator.should_stop) replace it as they replace the default
_sigterm_while_watched.stands_for_default = True  # type: ignore[attr-defined]


def _terminate_by_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class HangDoctor:
    """Watch this rank's steps and collectives; on a hang, report and end the job.

    `timeout`: seconds a step (between two `beat()` calls, the first one from `start()`)
    or one collective may take.
    `folder`: where the reports go. `store`: the process group's store (None: the folder
    alone carries the notice). `notify`: a file in which to write the folder's path for
    `accel launch`, which then prints the diagnosis; None: this process group prints it.
    """

    def __init__(
        self,
        timeout: float,
        *,
        rank: int,
        world_size: int,
        folder: str | os.PathLike[str],
        store: Any = None,
        notify: str | None = None,
        ring_size: int = 64,
        exit_process: bool = True,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"hang_timeout={timeout!r}: expected a number of seconds > 0.")
        self.timeout = float(timeout)
        self.rank, self.world_size = rank, world_size
        self.folder = Path(folder).resolve()
        self.store, self.notify = store, notify
        self.ring = _ring.CollectiveRing(ring_size)
        self.ring.on_error = self._collective_failed
        self.ring.on_settled = self._collective_settled
        self._sigterm_pending = False
        self.exit_process = exit_process
        self.last_beat = time.monotonic()  # the first step is timed from the start
        self.tick = min(0.25, self.timeout / 8)
        # The whole world looks for a notice (in the store, in the folder) at most
        # NOTICE_LOOKS_PER_SECOND times a second: every tick up to ~1,000 ranks, less often
        # above, so that neither the store's server nor a shared folder's serves O(N) looks
        # per tick; the wait for the others' reports covers two such intervals.
        self.notice_every = max(self.tick, world_size / NOTICE_LOOKS_PER_SECOND)
        # how long to wait for the other ranks' reports
        self.grace = max(1.0, self.timeout / 2, 2 * self.notice_every)
        self._stop = threading.Event()
        self._fired = threading.Lock()
        self._thread: threading.Thread | None = None
        self.diagnosis: str | None = None
        self.hooks: list[Any] = []  # handles (with .remove()) dropped by stop()
        self.host = "127.0.0.1"  # this machine's address toward the main one (start())

    # -- the rank's side --------------------------------------------------------------------
    def start(self) -> HangDoctor:
        """Install the ring and start the watchdog thread (stopping another doctor)."""
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            _ACTIVE.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in (report_path(self.folder, self.rank), stack_path(self.folder, self.rank)):
            path.unlink(missing_ok=True)
        if self.rank == 0:
            for name in (NOTICE_FILE, DIAGNOSIS_FILE, COLLECTED_FILE):
                (self.folder / name).unlink(missing_ok=True)
        _ring.ACTIVE, _ACTIVE = self.ring, self
        self.host = hosts.host_address()
        if self.store is not None:
            try:
                self.store.set(f"{HOST_KEY}/{self.rank}", self.host)
            except Exception:  # the notice file still works without the store
                self.store = None
        if _on_main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _sigterm_while_watched)
        self.beat()
        self._thread = threading.Thread(target=self._watch, name="accel-hang-doctor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the end of training); collectives are no longer recorded."""
        global _ACTIVE
        self._stop.set()
        if _on_main_thread() and signal.getsignal(signal.SIGTERM) is _sigterm_while_watched:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while self.hooks:
            self.hooks.pop().remove()
        if _ring.ACTIVE is self.ring:
            _ring.ACTIVE = None
        if _ACTIVE is self:
            _ACTIVE = None

    def beat(self) -> None:
        """A step boundary (a backward or an optimizer step): the step timer restarts."""
        self.last_beat = time.monotonic()

    # -- watching -----------------------------------------------------------------------------
    def _watch(self) -> None:
        import torch.distributed as dist

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the main thread's to take

        grouped = dist.is_available() and dist.is_initialized()
        next_look = time.monotonic()
        while not self._stop.wait(self.tick):
            if grouped and not dist.is_initialized():
                self.stop()  # end_training closed the process group: training is over
                return
            now = time.monotonic()
            reason = self._overdue(now)
            if reason is None and now >= next_look:
                next_look = now + self.notice_every
                reason = self._noticed()
            if reason is not None:
                self.report_and_exit(reason)
                return

    def _overdue(self, now: float) -> str | None:
        current = self.ring.current
        if current is not None and now - current.started > self.timeout:
            return (
                f"rank {self.rank} waited more than {self.timeout:g}s in {current.op} "
                f"#{current.seq} ({current.site})"
            )
        if current is None:
            # a collective that returned counts as progress too (an evaluation loop)
            last = self.ring.entries[-1].started if self.ring.entries else 0.0
            if now - max(self.last_beat, last) <= self.timeout:
                return None
            return f"rank {self.rank}: a step took more than {self.timeout:g}s"
        return None

    def _noticed(self) -> str | None:
        note = None
        if self.store is not None:
            try:
                if self.store.check([STORE_KEY]):
                    note = self.store.get(STORE_KEY).decode()
            except Exception:  # the store's host is gone: the folder still carries notices
                self.store = None
        if note is None and (self.folder / NOTICE_FILE).exists():
            note = (self.folder / NOTICE_FILE).read_text() or "another rank"
        return None if note is None else f"stopped by {note}"

    def _report_ends_process(self) -> bool:
        """A report is being written, and it ends the process (a held SIGTERM is not needed)."""
        return self._fired.locked() and self.exit_process

    def _collective_settled(self) -> None:
        """A collective returned (or its failure was handled): a SIGTERM held during it
        takes effect now, unless a report is ending the process."""
        if not self._sigterm_pending or self._report_ends_process():
            return
        self._sigterm_pending = False
        _terminate_by_sigterm()

    def _collective_failed(self, record: _ring.CollectiveRecord, error: BaseException) -> None:
        self.report_and_exit(
            f"rank {self.rank}: {record.op} #{record.seq} ({record.site}) failed: {record.error}"
        )

    # -- reporting ----------------------------------------------------------------------------
    def report_and_exit(self, reason: str) -> None:
        """Tell every rank, write this rank's report, print the diagnosis where this process
        is the one to print it, and end the process with `HANG_EXIT_CODE`."""
        if not self._fired.acquire(blocking=False):
            # The watchdog and a failed collective both noticed: one reports, and the other
            # waits for it to end the process rather than raise past it.
            if self.exit_process:
                threading.Event().wait()
            return
        self._stop.set()
        # A launcher ends every worker (SIGTERM) once one exits: hold it off until the report
        # is written and this process exits by itself.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if not reason.startswith("stopped by"):
            self._announce(reason)
        self.write_report(reason)
        if self.notify is not None:  # at once: a launcher may end this process any moment
            Path(self.notify).write_text(str(self.folder))
        if self.rank == 0:
            self._collect(reason, self.grace)
        elif not self._wait(self._collected, self._collector_time(), _POLL_OTHERS) and (
            self._lowest_reporting()  # rank 0 (and every rank below) wrote nothing
        ):
            self._collect(reason, 0.0)
        if self.exit_process:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(HANG_EXIT_CODE)

    def _collect(self, reason: str, grace: float) -> None:
        """Wait up to `grace` for every rank's report; name the machines of the ranks that
        wrote none, and whether each answers on the network; print the diagnosis where this
        process group prints it; mark the folder collected."""
        missing = self._missing_reports(grace)
        if missing:
            self.write_report(reason, missing=missing)
            if self.notify is not None:  # again: the launcher waits for the note to settle
                Path(self.notify).write_text(str(self.folder))
        if self.notify is None:
            self._print_diagnosis()
        (self.folder / COLLECTED_FILE).write_text(str(self.rank))

    def _collector_time(self) -> float:
        """How long a rank waits for the collector: its wait for the reports, its probes, its
        reading of the reports and a margin."""
        reading = self.world_size * _READ_SECONDS
        return self.grace + hosts.PROBE_SECONDS + reading + _COLLECT_MARGIN

    def _collected(self) -> bool:
        done = DIAGNOSIS_FILE if self.notify is None else COLLECTED_FILE
        return (self.folder / done).exists()

    def _lowest_reporting(self) -> bool:
        """No rank below this one wrote a report (looked at downwards: the rank just below
        usually has, so most ranks look at one file)."""
        return not any(report_path(self.folder, r).exists() for r in range(self.rank - 1, -1, -1))

    def _missing_reports(self, grace: float) -> list[int]:
        """The ranks whose report is still missing after up to `grace` seconds (each file is
        looked at until it appears: N looks, then one per missing rank and poll)."""
        pending = [r for r in self._ranks() if r != self.rank]
        deadline = time.monotonic() + grace
        while True:
            pending = [r for r in pending if not report_path(self.folder, r).exists()]
            if not pending or time.monotonic() >= deadline:
                return pending
            time.sleep(0.05)

    def _ranks(self) -> range:
        return range(self.world_size)

    def _announce(self, reason: str) -> None:
        (self.folder / NOTICE_FILE).write_text(f"rank {self.rank} ({reason})")
        if self.store is not None:
            try:
                self.store.set(STORE_KEY, f"rank {self.rank} ({reason})")
            except Exception:
                self.store = None

    def _wait(self, done: Any, seconds: float, poll: float = 0.05) -> bool:
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(poll)
        return True

    def _print_diagnosis(self) -> None:
        """The collector's diagnosis: the whole of it in the folder, `brief` on stderr."""
        done = self.folder / DIAGNOSIS_FILE
        self.diagnosis = diagnose(load_reports(self.folder, self.world_size))
        tmp = done.with_suffix(f".{self.rank}.tmp")
        tmp.write_text(self.diagnosis + "\n")
        os.replace(tmp, done)
        print(f"{brief(self.diagnosis)}\n  reports: {self.folder}", file=sys.stderr, flush=True)

    def _hosts_of(self, ranks: list[int]) -> dict[str, str]:
        """rank -> the address of its machine, for `ranks`, as far as the store (still) tells:
        one check and one multi_get where every rank recorded its machine, else a check (and
        a get) per rank."""
        found: dict[str, str] = {}
        if self.store is None or not ranks:
            return found
        keys = [f"{HOST_KEY}/{rank}" for rank in ranks]
        try:
            if self.store.check(keys):
                values = self.store.multi_get(keys)
                return {str(r): v.decode() for r, v in zip(ranks, values)}
            for rank, key in zip(ranks, keys):
                if self.store.check([key]):
                    found[str(rank)] = self.store.get(key).decode()
        except Exception:  # the store's host is gone
            self.store = None
        return found

    def write_report(self, reason: str, missing: list[int] | None = None) -> None:
        """`rank<k>.stack.txt` (every thread) and `rank<k>.json` (ring, stack, reason, this
        rank's machine; with `missing`, the ranks that wrote no report: their machines, as
        the store tells, and whether each answers on the network, probed once)."""
        with open(stack_path(self.folder, self.rank), "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
        report = {
            "rank": self.rank,
            "world_size": self.world_size,
            "reason": reason,
            "timeout": self.timeout,
            "collectives": self.ring.to_list(),
            "stack": main_thread_stack(),
            "nccl_trace": collect_nccl_trace(self.folder, self.rank),
            "host": self.host,
            "hosts": {str(self.rank): self.host},
        }
        if missing:
            lost = self._hosts_of(missing)
            report["hosts"].update(lost)
            report["probes"] = hosts.probe(sorted(set(lost.values()) - {self.host}))
        target = report_path(self.folder, self.rank)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, target)


def main_thread_stack() -> list[dict[str, Any]]:
    """The main thread's frames, outermost first, each marked `user` when it is outside
    accel, torch and the standard library."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    frames: list[dict[str, Any]] = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        file = frame.f_code.co_filename
        internal = module.partition(".")[0] in _ring.INTERNAL_MODULES
        stdlib = file.startswith(_STDLIB) or file.startswith("<")
        frames.append(
            {
                "file": file,
                "line": frame.f_lineno,
                "function": frame.f_code.co_name,
                "module": module,
                "user": not (internal or stdlib),
            }
        )
        frame = frame.f_back
    return frames[::-1]


def collect_nccl_trace(folder: Path, rank: int) -> str:
    """Write NCCL's Flight Recorder dump beside the report where CUDA provides one; else say
    why there is none."""
    import torch

    if not torch.cuda.is_available():
        return "skipped: no CUDA on this machine (the Flight Recorder records NCCL only)"
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_backend() == "nccl"):
        return "skipped: the process group is not NCCL"
    if not int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0") or 0):
        return (
            "skipped: TORCH_NCCL_TRACE_BUFFER_SIZE is not set (accel launch --hang_timeout sets it)"
        )
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is None:
        return "skipped: this torch has no _dump_nccl_trace"
    path = folder / f"rank{rank}.nccl_trace.pkl"
    try:
        path.write_bytes(dump())
    except Exception as err:  # the recorder is best effort: the report matters more
        return f"failed: {type(err).__name__}: {err}"
    return str(path)


def process_group_store() -> Any:
    """The default process group's store, or None (no group, or torch hides it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # a private accessor: the notice file still works without it
        return None
