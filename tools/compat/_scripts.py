"""accelerate's distributed test scripts, launched on CPU processes against both libraries.

accelerate's tests launch `accelerate/test_utils/scripts/*.py` (and `external_deps/*.py`) only
where several GPUs are present. Here each runs on N = 1 and 2 CPU processes: on the accelerate
side the sdist's script as it is, on the accel side the rewritten copy under the suite's work
tree (`accel_suite/test_utils/scripts`, imports rewritten by `run_accelerate_suite.rewrite`):

    accel launch --cpu --num_processes N --main_process_port P script.py
    accelerate launch --cpu --num_processes 1 --main_process_port P script.py
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 ... script.py

accelerate's `launch --cpu` runs one process whatever `--num_processes` says (its simple
launcher), so its 2-process baseline goes through torchrun (`--multi_gpu`) with the CPU asked
for in the environment: an `Accelerator()` is then MULTI_CPU over gloo. (A bare `PartialState()`
of accelerate never is on a machine without GPUs: each of its workers runs alone, so a script
that uses only PartialState passes there without testing anything distributed.)

A launch passes when it exits 0 within `SCRIPT_TIMEOUT_S` (killed with its workers after).
Scripts that need GPUs, a library that is not installed or the Hub are skipped with their
reason and counted; so are the process counts a script refuses. Accel failures that are
expected are listed, with their reason, under `[script_failures]` in expected_failures.toml
(key: `scripts/<script> x<N>`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SCRIPT_TIMEOUT_S = 300
PROCESS_COUNTS = (1, 2)
_LOG_TAIL = 40  # lines of a failed launch's log printed under the table


@dataclass(frozen=True)
class Script:
    """How one script is run: skipped (with why), or launched, and with what."""

    # hardware / network reason that holds whatever is installed ("" when it runs here)
    skip: str = ""
    # modules it imports at the top: missing ones skip it ("library: X is not installed")
    needs: tuple[str, ...] = ()
    # how accelerate's tests start it: "launch" (accelerate launch) or "python" (the script
    # starts its own processes; the count goes in ACCELERATE_NUM_PROCESSES)
    how: str = "launch"
    # the process counts it can run on (accelerate's tests launch it with these only)
    counts: tuple[int, ...] = (1, 2)
    note: str = ""


# Every script of accelerate 1.15.0's test_utils/scripts; one that appears in a later version
# and is not listed here runs with the defaults.
SCRIPTS: dict[str, Script] = {
    "test_cli.py": Script(),
    "test_ddp_comm_hook.py": Script(
        skip="hardware: its reference DDP model takes device_ids=[local rank], which only a GPU "
        "module accepts (fails so on accelerate too)"
    ),
    "test_distributed_data_loop.py": Script(counts=(2,)),
    "test_merge_weights.py": Script(counts=(2,), note="accelerate shards with FSDP1, accel FSDP2"),
    # accelerate's test runs it with plain python and ACCELERATE_NUM_PROCESSES=2: it starts its
    # own processes through notebook_launcher; with 1 its multi-process checks are not skipped
    # (they are pytest marks) and fail on accelerate too
    "test_notebook.py": Script(how="python", needs=("pytest",), counts=(2,)),
    "test_ops.py": Script(),
    "test_script.py": Script(needs=("pytest",)),
    "test_sync.py": Script(),
    "external_deps/test_checkpointing.py": Script(
        skip="network: loads bert-base-cased and nyu-mll/glue (mrpc) from the Hub",
        needs=("transformers", "datasets", "evaluate"),
    ),
    "external_deps/test_ds_alst_ulysses_sp.py": Script(
        skip="network: loads hf-internal-testing/tiny-random-LlamaForCausalLM and its tokenizer "
        "from the Hub (the recipe runs on CPU: accel's test_deepspeed_sequence_parallel.py)",
        needs=("deepspeed", "transformers"),
    ),
    "external_deps/test_ds_multiple_model.py": Script(
        skip="network: loads bert-base-cased and nyu-mll/glue (mrpc) from the Hub",
        needs=("deepspeed", "transformers", "datasets", "evaluate"),
    ),
    "external_deps/test_metrics.py": Script(
        needs=("transformers", "datasets", "evaluate"),
        note="its Hub (mrpc) part runs only on a GPU",
    ),
    "external_deps/test_peak_memory_usage.py": Script(
        skip="hardware: measures CUDA memory; network: loads bert-base-cased and glue from the Hub",
        needs=("transformers", "datasets"),
    ),
    "external_deps/test_performance.py": Script(
        skip="network: loads bert-base-cased and nyu-mll/glue (mrpc) from the Hub",
        needs=("transformers", "datasets", "evaluate"),
    ),
    "external_deps/test_pippy.py": Script(
        needs=("transformers",), note="checks run only on GPUs (prints so, exits 0)"
    ),
    "external_deps/test_zero3_integration.py": Script(
        skip="hardware: initializes an nccl process group; network: loads sshleifer/tiny-gpt2",
        needs=("transformers", "deepspeed"),
    ),
}


@dataclass
class Launch:
    """One launch of one script on one side."""

    script: str
    processes: int
    outcome: str  # "pass", "fail", "timeout" or "skip"
    seconds: float = 0.0
    reason: str = ""  # a skip's reason, or the line naming a failure's error
    log: str = ""

    @property
    def key(self) -> str:
        return f"scripts/{self.script} x{self.processes}"


def script_names(scripts_dir: Path) -> list[str]:
    """The scripts under `scripts_dir` (`test_*.py`, and `external_deps/test_*.py`)."""
    found = [p.relative_to(scripts_dir).as_posix() for p in scripts_dir.rglob("test_*.py")]
    return sorted(found, key=lambda n: (n.count("/"), n))


# Launches that a torch release cannot run to the end: (script, processes) -> (the torch
# releases, as "major.minor", and why).
TORCH_SKIPS: dict[tuple[str, int], tuple[tuple[str, ...], str]] = {
    ("external_deps/test_metrics.py", 2): (
        ("2.9",),
        "torch 2.9: the process can hang as it exits (DDP's Reducer frees the gloo process "
        "group last and joins its worker threads holding the GIL, while a worker frees the "
        "tensors of the last all_gather and waits for the GIL; seen in 1 of 4 launches under "
        "load, in none of 10 on torch 2.15)",
    ),
}


def _torch_release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return ".".join(version("torch").split(".")[:2])
    except PackageNotFoundError:
        return ""


def skip_reason(name: str, processes: int) -> str:
    spec = SCRIPTS.get(name, Script())
    if spec.skip:
        return spec.skip
    releases, why = TORCH_SKIPS.get((name, processes), ((), ""))
    if _torch_release() in releases:
        return why
    if processes not in spec.counts:
        return f"processes: runs on {' or '.join(map(str, spec.counts))} processes only"
    missing = [m for m in spec.needs if importlib.util.find_spec(m) is None]
    return f"library: {', '.join(missing)} not installed" if missing else ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command_line(side: str) -> list[str]:
    """`accelerate` / `accel`, as installed beside this interpreter."""
    exe = Path(sys.executable).parent / side
    if exe.exists():
        return [str(exe)]
    module = "accelerate.commands.accelerate_cli" if side == "accelerate" else "accel_cli.main"
    return [sys.executable, "-m", module]


def launch_command(side: str, script: Path, processes: int, how: str) -> list[str]:
    if how == "python":
        return [sys.executable, str(script)]
    # accelerate's --cpu starts one process only (see the module's docstring)
    several = side == "accelerate" and processes > 1
    flags = ["--multi_gpu" if several else "--cpu", "--num_processes", str(processes)]
    flags += ["--main_process_port", str(_free_port())]
    return [*_command_line(side), "launch", *flags, str(script)]


def _environment(side: str, work: Path, processes: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "ACCEL_", "FSDP_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))
        and k not in ("MASTER_ADDR", "MASTER_PORT")
    }
    env |= {
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # read by scripts that start their own processes (test_notebook.py)
        "ACCELERATE_NUM_PROCESSES": str(processes),
    }
    if side == "accelerate" and processes > 1:
        env["ACCELERATE_USE_CPU"] = "true"  # with --multi_gpu: torchrun workers on the CPU
    if side == "accel":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work), env.get("PYTHONPATH")]))
    return env


def run_one(side: str, scripts_dir: Path, work: Path, name: str, processes: int) -> Launch:
    """Launch one script; a launch that runs past the timeout is killed with its workers."""
    reason = skip_reason(name, processes)
    if reason:
        return Launch(name, processes, "skip", reason=reason)
    spec = SCRIPTS.get(name, Script())
    cmd = launch_command(side, scripts_dir / name, processes, spec.how)
    run_dir = work / "script-runs" / f"{name.replace('/', '-')}.x{processes}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=run_dir,
        env=_environment(side, work, processes),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
        outcome = "pass" if proc.returncode == 0 else "fail"
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # something still holds the pipe: stop reading
            proc.kill()
            out = ""
        outcome = "timeout"
    seconds = time.perf_counter() - start
    log = f"$ {' '.join(cmd)}\n{out}"
    logs = work / "logs" / "scripts"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{name.replace('/', '-')}.x{processes}.log").write_text(log)
    shutil.rmtree(run_dir, ignore_errors=True)
    reason = f"timed out after {SCRIPT_TIMEOUT_S} s" if outcome == "timeout" else ""
    if outcome == "fail":
        reason = _last_error(out)
    return Launch(name, processes, outcome, seconds, reason, log)


def _kill_tree(proc: subprocess.Popen) -> None:
    """The launcher and every process under it: torchrun's workers start sessions of their own,
    so killing the launcher's group alone leaves them running (and holding its output)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in tree:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, tree = psutil.wait_procs(tree, timeout=10)
        if not tree:
            return


_WRAPPERS = ("ChildFailedError", "CalledProcessError", "SignalException")


def _last_error(out: str) -> str:
    """The line that names the script's error (the first `SomethingError: ...` that is not the
    launcher's report of a failed worker: the first rank to fail prints first, and the others
    often fail because of it), else the last line."""
    lines = [re.sub(r"^\[rank\d+\]: ", "", line).strip() for line in out.splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        head = line.split(":", 1)[0].split(".")[-1]
        if (
            head.endswith(("Error", "Exception", "Failed"))
            and " " not in head
            and head not in _WRAPPERS
        ):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def run_side(
    side: str,
    scripts_dir: Path,
    work: Path,
    names: list[str],
    counts: tuple[int, ...] = PROCESS_COUNTS,
    echo: Callable[[Launch], None] | None = None,
) -> dict[str, Launch]:
    results = {}
    for name in names:
        for n in counts:
            res = run_one(side, scripts_dir, work, name, n)
            results[res.key] = res
            if echo:
                echo(res)
    return results


def cell(res: Launch | None) -> str:
    if res is None:
        return "-"
    if res.outcome == "skip":
        return "skip"
    return f"{res.outcome} {res.seconds:4.0f}s"


def report(names: list[str], counts: tuple[int, ...], results: dict[str, dict[str, Launch]]) -> str:
    """The table: one row per script and process count, one column per side; then each failure
    and skip with its reason."""
    sides = list(results)
    lines = [f"{'script':44} {'procs':>5}" + "".join(f" | {s:>12}" for s in sides)]
    lines.append("-" * len(lines[0]))
    for name in names:
        for n in counts:
            key = f"scripts/{name} x{n}"
            cells = "".join(f" | {cell(results[s].get(key)):>12}" for s in sides)
            lines.append(f"{name:44} {n:5d}{cells}")
    lines.append("")
    for s in sides:
        rs = results[s].values()
        tally = {k: sum(r.outcome == k for r in rs) for k in ("pass", "fail", "timeout", "skip")}
        lines.append(
            f"{s} scripts: {tally['pass']} passed, {tally['fail'] + tally['timeout']} failed "
            f"({tally['timeout']} timed out), {tally['skip']} skipped ({len(rs)} launches)"
        )
    skipped = {
        f"{r.script} x{r.processes}" if r.reason.startswith("processes") else r.script: r.reason
        for rs in results.values()
        for r in rs.values()
        if r.outcome == "skip"
    }
    if skipped:
        lines.append("\nskipped:")
        lines += [f"  {k}: {v}" for k, v in sorted(skipped.items())]
    notes = {n: SCRIPTS[n].note for n in names if n in SCRIPTS and SCRIPTS[n].note}
    if notes:
        lines.append("\nnotes:")
        lines += [f"  {k}: {v}" for k, v in notes.items()]
    for s in sides:
        for r in results[s].values():
            if r.outcome in ("fail", "timeout"):
                lines.append(f"\n{s} {r.key}: {r.reason}")
    return "\n".join(lines)


def log_tail(res: Launch) -> str:
    return "\n".join(res.log.splitlines()[-_LOG_TAIL:])


def check(
    accel: dict[str, Launch], listed: dict[str, str], reasons: tuple[str, ...], file: str
) -> list[str]:
    """Problems: an accel failure not listed (with a reason of `reasons`), a listed one that
    passes now (reported, not a problem)."""
    problems = []
    for key, why in sorted(listed.items()):
        if why.split(":")[0] not in reasons:
            problems.append(f"{file}: {key}: the reason must start with one of {reasons}: {why!r}")
    for key, res in sorted(accel.items()):
        if res.outcome in ("fail", "timeout") and key not in listed:
            problems.append(
                f"unlisted script failure: {key}: {res.reason}  (fix accel, or list it with its "
                f"reason under [script_failures] in {file})"
            )
        elif res.outcome == "pass" and key in listed:
            print(f"listed but passing now (remove it from {file}): {key}")
    return problems
