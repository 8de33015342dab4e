"""Stopping on request: SIGTERM / SIGUSR1 become a flag that every rank agrees on.

Preemption and job time limits arrive as signals: SIGTERM (scancel, preemption, a launcher
passing one on) and SIGUSR1 (what SLURM sends ahead of the time limit with
``--signal=USR1@<seconds>``). Killing the process there loses the work since the last
checkpoint, and one rank stopping alone leaves the others stuck in a collective. So the
first call of `Accelerator.should_stop()` installs handlers that only raise a flag, and each
call agrees on it across ranks with one small all-reduce, so that every rank answers True at
the same step and can save and return together::

    for batch in loader:
        ...
        if accelerator.should_stop():
            accelerator.save_state()
            break

A loop that never asks keeps the default behaviour (SIGTERM ends the process). A handler
the program installed itself is left in place.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import torch

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: list[int] = []  # the signals seen by this process (process-wide)
_installed = False


def _on_stop_signal(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)


def install_stop_handlers() -> None:
    """Turn SIGTERM and SIGUSR1 into a stop request (once per process, main thread only);
    a handler the program set itself is kept."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        # the hang doctor's SIGTERM handler is the default held during collectives
        if current in (signal.SIG_DFL, signal.SIG_IGN, None) or getattr(
            current, "stands_for_default", False
        ):
            signal.signal(sig, _on_stop_signal)
    _installed = True


def stop_signal_received() -> bool:
    """Whether this process got a stop signal since the handlers were installed."""
    return bool(_received)


def _reset_stop_request() -> None:
    """Forget received signals (tests)."""
    _received.clear()


class StoppingMixin:
    """`should_stop()` for the Accelerator (it supplies `reduce` and `_collective_device`)."""

    def should_stop(self) -> bool:
        """True on every process once any process received SIGTERM or SIGUSR1.

        Call it at a step boundary; it costs one one-element all-reduce when there are
        several processes. The first call installs the signal handlers.
        """
        install_stop_handlers()
        local = 1.0 if stop_signal_received() else 0.0
        if self.num_processes == 1:  # type: ignore[attr-defined]
            stop = local > 0
        else:
            this: Any = self
            flag = torch.tensor([local], device=this._collective_device())
            stop = bool(this.reduce(flag, "sum").item() > 0)
        if stop:
            ignore_repeated_stop_signals()
        doctor = getattr(self, "_hang_doctor", None)
        if doctor is not None:  # a loop that asks is at a step boundary: it is alive
            doctor.beat()
        return stop


def ignore_repeated_stop_signals() -> None:
    """Once a stop is agreed, further SIGTERM / SIGUSR1 are ignored (where ours handle them).

    The same stop often arrives twice: SLURM signals every process of a step and the launcher
    passes its own on. A repeat that lands while the interpreter shuts down, after the run
    saved and returned, would otherwise kill the process with the signal (Python puts the
    default handlers back at exit), and the launcher would report a failure instead of the
    stop. SIGKILL, and a launcher's escalation to it, still end the process."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is _on_stop_signal:
            signal.signal(sig, signal.SIG_IGN)
