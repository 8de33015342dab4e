"""torchrun as `accel launch` runs it: `torch.distributed.run` itself, except that its first
SIGTERM is a stop request for the workers instead of the end of the run.

SLURM signals every process of a job step at once (`scancel --signal=TERM`, preemption, the
time limit), so torchrun gets SIGTERM together with its workers and the launcher. torchrun's
own handler shuts the workers down and exits 1, even when each of them saved at a step
boundary and returned 0: the run looked failed, and the launcher could not tell a job script
to requeue it. Here the first SIGTERM is passed on to the workers (as the launcher does) and
torchrun keeps watching them; workers that stop on request return 0, torchrun exits 0, and
the launcher exits with its stopped code. A second SIGTERM, or `ESCALATE_SIGNAL` (the
launcher's "stop now"), is torchrun's usual shutdown: SIGTERM to the workers, SIGKILL after
its grace period, exit 1. (torch 2.9's torchrun takes SIGTERM whatever its signal list says;
its handler passes it on to this one.)

    python -m accel_cli._torchrun <torchrun arguments>
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

# What the launcher sends when torchrun must stop now (a second request, or a restart after
# a stop): torchrun's own handling of SIGTERM.
ESCALATE_SIGNAL = signal.SIGUSR2
# torchrun installs its death-signal handler for the signals its --signals-to-handle names
# (default SIGTERM,SIGINT,SIGHUP,SIGQUIT; PET_SIGNALS_TO_HANDLE is that option's variable),
# passed to the workers' context as TORCHELASTIC_SIGNALS_TO_HANDLE (which torch before the
# option read directly). SIGTERM is taken out of both and left to our handler.
ENV_SIGNALS_OPTION = "PET_SIGNALS_TO_HANDLE"
ENV_SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
_TORCHRUN_DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def _signal_workers(signum: int) -> None:
    """Send `signum` to this process's children (torchrun's workers)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        try:
            child.send_signal(signum)
        except psutil.Error:  # gone already
            continue


class _StopRequestHandler:
    """The first SIGTERM goes to the workers; a second one, or ESCALATE_SIGNAL, raises
    torchrun's SignalException, which its agent answers by shutting the workers down."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM and not self.requested:
            self.requested = True
            _signal_workers(signal.SIGTERM)
            return
        from torch.distributed.elastic.multiprocessing import SignalException

        raise SignalException(
            f"Process {os.getpid()} got signal: {signal.Signals(signum).name}",
            sigval=signal.SIGTERM,
        )


def without_sigterm(names: str) -> str | None:
    """The signal list for torchrun without SIGTERM (None when nothing would be left)."""
    kept = [n.strip() for n in names.split(",") if n.strip() and n.strip() != "SIGTERM"]
    return ",".join(kept) or None


def _route_sigterm(handler: _StopRequestHandler) -> None:
    """torch 2.9's torchrun installs its death-signal handler on SIGTERM whatever its signal
    list says (it has no --signals-to-handle), replacing ours when it starts the workers: its
    handler passes SIGTERM on to ours (the other signals are its own as before)."""
    from torch.distributed.elastic.multiprocessing import api

    death = getattr(api, "_terminate_process_handler", None)
    if death is None:
        return

    def route(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            handler(signum, frame)
        else:
            death(signum, frame)

    api._terminate_process_handler = route


def main(argv: Sequence[str] | None = None) -> None:
    handler = _StopRequestHandler()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(ESCALATE_SIGNAL, handler)
    _route_sigterm(handler)
    names = (
        os.environ.get(ENV_SIGNALS_OPTION)
        or os.environ.get(ENV_SIGNALS_TO_HANDLE)
        or _TORCHRUN_DEFAULT_SIGNALS
    )
    kept = without_sigterm(names)
    if kept is not None:
        os.environ[ENV_SIGNALS_OPTION] = os.environ[ENV_SIGNALS_TO_HANDLE] = kept
    from torch.distributed.run import main as torchrun_main

    torchrun_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
