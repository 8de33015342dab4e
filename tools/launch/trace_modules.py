"""Count how often `accel launch`'s arguments go back to an accel-cli module they already left.

Runs `accel launch ARGS` in this process (with --dry_run added, so nothing starts) under
sys.setprofile, records the accel_cli module of every Python function called, collapses
consecutive calls within one module, and reports the modules visited and the number of
returns: calls into a module that the sequence had already left. The count starts where the
launch command starts (`accel_cli._commands.launch.run`, after argparse has parsed the flags);
module-level code run while importing is left out.

    uv run python tools/launch/trace_modules.py --num_processes 2 --cpu script.py
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any


def trace(argv: list[str], *, reads: bool = True) -> list[str]:
    """The accel_cli modules `main(["launch", "--dry_run", *argv])` calls into, in order;
    without `reads`, leaving out the reads of the frozen LaunchConfig's properties (reading
    the resolved plan, which every later stage holds, rather than calling back into it)."""
    from accel_cli import _commands  # noqa: F401  (imports done before tracing)
    from accel_cli._commands import launch  # noqa: F401
    from accel_cli._launch_config import LaunchConfig
    from accel_cli.main import main

    properties = {n for n, v in vars(LaunchConfig).items() if isinstance(v, property)}
    seen: list[str] = []
    started = False

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal started
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if name == "accel_cli._commands.launch" and frame.f_code.co_name == "run":
            started = True
        if not reads and name == "accel_cli._launch_config" and frame.f_code.co_name in properties:
            return
        ours = started and name.startswith("accel_cli") and frame.f_code.co_name != "<module>"
        if ours and (not seen or seen[-1] != name):
            seen.append(name)

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        sys.setprofile(profile)
        try:
            code = main(["launch", "--dry_run", *argv])
        finally:
            sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"accel launch exited {code}: {err.getvalue()}")
    return seen


def returns(sequence: list[str]) -> int:
    """Entries of `sequence` naming a module that appeared earlier (and was left since)."""
    return sum(1 for i, module in enumerate(sequence) if module in sequence[:i])


if __name__ == "__main__":
    sequence = trace(sys.argv[1:])
    print(
        f"modules: {len(set(sequence))}, transitions: {len(sequence) - 1}, "
        f"returns: {returns(sequence)} ({returns(trace(sys.argv[1:], reads=False))} without "
        f"the reads of LaunchConfig's properties)"
    )
    print(" -> ".join(m.removeprefix("accel_cli.") for m in sequence))
