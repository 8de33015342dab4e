"""Run the child process, pass stop requests on to the workers, and return its exit code.

A stop request is SIGTERM or SIGUSR1 (what SLURM sends before a time limit when asked with
`--signal=USR1@<seconds>`). The first one goes to the workers themselves: to the script
when it runs directly, to torchrun's workers (its children) when torchrun runs them, so an
Accelerator that asks `should_stop()` saves at the next step boundary and returns. When the
child then exits 0, the launcher exits with `STOPPED_EXIT_CODE`, which tells a job script
that the run stopped on request and can be resumed (requeue it). A second request, or
torchrun starting new workers after one (a restart), stops torchrun itself, which ends its
workers. SIGINT from another process is passed on as well.

torchrun runs as `accel_cli._torchrun`, which takes its first SIGTERM as a stop request for
the workers too: SLURM signals every process of a step at once, torchrun included, and
torchrun's own handling would end the run with 1 although the workers saved and returned 0.
The launcher tells it to stop for good with `ESCALATE_SIGNAL`.

The child starts with SIGUSR1 ignored, so that a process which does not ask for it (torchrun,
a script without an Accelerator) is not killed by SLURM's early warning; the Accelerator
installs its own handler.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from accel_cli._torchrun import ESCALATE_SIGNAL

# The launcher's exit code after a requested stop (SIGTERM, SIGUSR1) when the workers
# stopped cleanly: sysexits' EX_TEMPFAIL, "try again later".
STOPPED_EXIT_CODE = 75
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_FORWARDED = (signal.SIGINT, *_STOP_SIGNALS)
_POLL_SECONDS = 0.2
TORCHRUN_MODULE = "torch.distributed.run"
TORCHRUN_WRAPPER = "accel_cli._torchrun"


def exit_code(returncode: int) -> int:
    """A child's return code as a shell would report it (128 + N when killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def _sent_by_terminal() -> bool:
    """Whether a SIGINT most likely came from Ctrl-C in our terminal.

    The terminal sends it to its whole foreground process group, which includes the child,
    so forwarding it as well would interrupt the child twice.
    """
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, OSError, ValueError):
            continue
    return False


def _ignore_sigusr1() -> None:  # runs in the child between fork and exec
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _children(pid: int) -> dict[int, object]:
    """The direct children of `pid` (pid -> psutil.Process); {} once it is gone."""
    import psutil

    try:
        return {p.pid: p for p in psutil.Process(pid).children()}
    except psutil.Error:
        return {}


class _Stopper:
    """What the launcher does on signals: where a stop request goes, and whether one came."""

    def __init__(
        self, child: subprocess.Popen, through_torchrun: bool, stop_now: int = signal.SIGTERM
    ) -> None:
        self.child = child
        self.through_torchrun = through_torchrun
        self.stop_now = stop_now  # what ends torchrun (and so its workers) for good
        self.requested = False
        self.signalled: set[int] = set()  # workers that got the request

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _sent_by_terminal():
            return
        if self.child.poll() is not None:
            return
        if signum not in _STOP_SIGNALS:
            self.child.send_signal(signum)
            return
        if self.requested or not self.through_torchrun:
            # A second request stops torchrun, which ends its workers (SIGTERM, then SIGKILL).
            self.child.send_signal(self.stop_now if self.through_torchrun else signum)
            self.requested = True
            return
        self.requested = True
        workers = _children(self.child.pid)
        for pid, proc in workers.items():
            try:
                proc.send_signal(signum)  # type: ignore[attr-defined]
                self.signalled.add(pid)
            except Exception:  # gone already
                continue
        if not workers:  # torchrun has no workers right now (between restarts)
            self.child.send_signal(self.stop_now)

    def check_restart(self) -> None:
        """After a stop request, workers that torchrun started since are a restart: stop it."""
        if not (self.requested and self.through_torchrun and self.signalled):
            return
        if set(_children(self.child.pid)) - self.signalled and self.child.poll() is None:
            self.child.send_signal(self.stop_now)
            self.signalled.clear()


def run_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    through_torchrun: bool = False,
    on_poll: Callable[[], None] | None = None,
) -> int:
    """Start `argv`, wait for it, and return its exit code (`STOPPED_EXIT_CODE` when it
    stopped cleanly on a SIGTERM / SIGUSR1 that the launcher received).

    `through_torchrun`: the child is torchrun and the workers are its children, which get
    the first stop request directly. The launcher keeps waiting until the child exits.
    `python -m torch.distributed.run ...` runs as `python -m accel_cli._torchrun ...`.
    `on_poll`: called every poll while the child runs (the hang doctor's note is watched so).
    """
    argv, stop_now = list(argv), signal.SIGTERM
    if through_torchrun and argv[1:3] == ["-m", TORCHRUN_MODULE]:
        argv[2], stop_now = TORCHRUN_WRAPPER, ESCALATE_SIGNAL
    try:
        child = subprocess.Popen(argv, env=dict(env), preexec_fn=_ignore_sigusr1)
    except OSError as err:
        print(f"accel: cannot start {argv[0]!r}: {err}", file=sys.stderr)
        return 127

    stopper = _Stopper(child, through_torchrun, stop_now)
    in_main_thread = threading.current_thread() is threading.main_thread()
    sigs = _FORWARDED if in_main_thread else ()  # handlers can only be set from the main thread
    previous = {sig: signal.signal(sig, stopper.on_signal) for sig in sigs}
    try:
        while True:
            try:
                code = exit_code(child.wait(timeout=_POLL_SECONDS))
            except subprocess.TimeoutExpired:
                stopper.check_restart()
                if on_poll is not None:
                    on_poll()
                continue
            if stopper.requested and code == 0:
                print(
                    f"accel: stopped on request; exiting with {STOPPED_EXIT_CODE} (resume the run "
                    f"from its newest checkpoint)",
                    file=sys.stderr,
                )
                return STOPPED_EXIT_CODE
            return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
