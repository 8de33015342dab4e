"""Run the child process, forward SIGINT and SIGTERM to it, and return its exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

_FORWARDED = (signal.SIGINT, signal.SIGTERM)


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


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start `argv`, wait for it, and return its exit code.

    SIGTERM is always passed on to the child; SIGINT too, unless the terminal already
    delivered it to the child. The launcher itself keeps waiting until the child exits.
    """
    try:
        child = subprocess.Popen(list(argv), env=dict(env))
    except OSError as err:
        print(f"accel: cannot start {argv[0]!r}: {err}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _sent_by_terminal():
            return
        if child.poll() is None:
            child.send_signal(signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    sigs = _FORWARDED if in_main_thread else ()  # handlers can only be set from the main thread
    previous = {sig: signal.signal(sig, forward) for sig in sigs}
    try:
        while True:
            try:
                return exit_code(child.wait())
            except InterruptedError:  # pragma: no cover - wait() retries on EINTR already
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
