"""`accel test`: launch a built-in script with the configuration and report each part.

The script (`_selftest_worker.py`) goes through the same steps as `accel launch`: the
configuration is resolved, the command built (torchrun for several processes) and the
workers get `ACCEL_LAUNCH_CONFIG`. The parts: the processes start, collectives give the
expected values, a few training steps with the Accelerator equal plain PyTorch on one
process doing the whole global batch, and a checkpoint saved and loaded restores the
weights and optimizer state exactly. On several machines each machine checks its own
processes (and the checkpoint folder lives in a temporary folder of the main machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accel_cli._command import build_command, build_env, physical_cores, with_rendezvous
from accel_cli._launch_config import LaunchConfig

PARTS = {
    "start": "processes start",
    "collectives": "collectives",
    "training": "training matches 1 process",
    "checkpoint": "checkpoint round-trip",
}
_WORKER = Path(__file__).with_name("_selftest_worker.py")
_LOG_TAIL = 40


def run_selftest(config: LaunchConfig, timeout: float, say: Callable[[str], None]) -> int:
    """Launch the check, print one line per part, return 0 when no part failed."""
    config = with_rendezvous(config)
    with tempfile.TemporaryDirectory(prefix="accel-test-") as tmp:
        out = Path(tmp)
        cmd = build_command(config, str(_WORKER), [str(out)])
        cores = physical_cores() if config.cpu and config.nproc_per_node > 1 else None
        env = build_env(config, os.environ, cpu_cores=cores)
        log = out / "output.log"
        with log.open("w") as sink:
            code = _run(cmd, env, sink, timeout)
        first = config.machine_rank * config.nproc_per_node
        ranks = range(first, first + config.nproc_per_node)
        reports = {r: _read(out / f"rank{r}.json") for r in ranks}
        failed = _print_parts(reports, say)
        if code is None:
            say(f"timed out after {timeout:g} s (raise --timeout if the machine is just slow)")
            failed = True
        elif code != 0 and not failed:
            say(f"the processes exited with code {code}")
            failed = True
        if failed:
            lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
            say("last lines of the processes' output:")
            for line in lines:
                say(f"  | {line}")
    say("all parts passed" if not failed else "FAILED")
    return 1 if failed else 0


def _run(cmd: list[str], env: dict[str, str], sink: Any, timeout: float) -> int | None:
    """The exit code, or None after killing the whole process group on timeout."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _print_parts(reports: dict[int, dict[str, Any] | None], say: Callable[[str], None]) -> bool:
    width = max(len(label) for label in PARTS.values())
    failed = False
    for part, label in PARTS.items():
        status, detail = _verdict(part, reports)
        failed |= status == "FAIL"
        say(f"  {label.ljust(width)}  {status:<4}  {detail}")
    return failed


def _verdict(part: str, reports: dict[int, dict[str, Any] | None]) -> tuple[str, str]:
    results = {r: (rep or {}).get("parts", {}).get(part) for r, rep in reports.items()}
    missing = sorted(r for r, res in results.items() if res is None)
    failures = [(r, res) for r, res in results.items() if res and res["status"] == "fail"]
    if failures:
        rank, res = failures[0]
        return "FAIL", f"rank {rank}: {res['detail']}"
    if missing:
        return "FAIL", f"no result from rank(s) {', '.join(map(str, missing))}"
    statuses = {res["status"] for res in results.values()}
    first = next(iter(results.values()))
    if statuses == {"skip"}:
        return "skip", first["detail"]
    return "pass", first["detail"]


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed `accel` package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("accel")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("The `accel` package is not installed: pip install accel.")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*components)


def execute_subprocess_async(
    cmd: list[str],
    env: dict[str, str] | None = None,
    stdin: Any = None,
    timeout: float = 180,
    quiet: bool = False,
    echo: bool = True,
) -> subprocess.CompletedProcess:
    """Run `cmd`, echoing its output unless `quiet`; a non-zero exit raises RuntimeError
    with the output."""
    if echo:
        print("\nRunning:", " ".join(str(c) for c in cmd))
    result = subprocess.run(
        [str(c) for c in cmd], env=env, input=stdin, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if not quiet:
        print(result.stdout, end="")
        print(result.stderr, end="")
    if result.returncode:
        raise RuntimeError(
            f"{' '.join(str(c) for c in cmd)!r} failed with exit code {result.returncode}.\n"
            f"stderr:\n{result.stderr}"
        )
    return result
