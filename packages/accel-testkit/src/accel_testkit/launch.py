"""The `accel` command line as the tests run it: a subprocess of this interpreter (the CLI is
never imported here, so the testkit does not depend on accel-cli), and the environment its
workers get."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from fnmatch import fnmatchcase
from pathlib import Path

__all__ = ["LAUNCHER_VARS", "accel_command", "launch_command", "worker_env"]

# What torchrun sets for each worker: a test run under a launcher must not hand them down.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def accel_command(*args: object, entry_point: bool = False) -> list[str]:
    """``python -m accel_cli.main ARGS`` with this interpreter, each argument as a string
    (paths and numbers may be passed as they are). With `entry_point`, the `accel` script
    installed beside this interpreter, as a user runs it, where there is one."""
    argv = [str(a) for a in args]
    if entry_point:
        script = Path(sys.executable).with_name("accel")
        if script.is_file():
            return [str(script), *argv]
    return [sys.executable, "-m", "accel_cli.main", *argv]


def launch_command(
    *args: object, num_processes: int | None = 2, cpu: bool = True, entry_point: bool = False
) -> list[str]:
    """``accel launch --cpu --num_processes 2 ARGS``: `args` are the launcher's other flags,
    then the script and its arguments. ``cpu=False`` and ``num_processes=None`` leave the
    flags out."""
    flags: list[object] = ["--cpu"] if cpu else []
    if num_processes is not None:
        flags += ["--num_processes", num_processes]
    return accel_command("launch", *flags, *args, entry_point=entry_point)


def worker_env(*, drop: Iterable[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a child: without the variables that match a pattern of
    `drop` (fnmatch's, case-sensitive: ``"ACCEL_*"``, ``*LAUNCHER_VARS``), with
    ``OMP_NUM_THREADS=1`` (the tests start many processes on few cores), then `extra`."""
    patterns = tuple(drop)
    env = {k: v for k, v in os.environ.items() if not any(fnmatchcase(k, p) for p in patterns)}
    return {**env, "OMP_NUM_THREADS": "1", **extra}
