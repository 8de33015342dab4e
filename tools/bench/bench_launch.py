"""Launcher start-up: `accel launch` vs `torchrun` vs `accelerate launch`, 2 processes.

Measures, from the moment the command starts, the time until the first line the launched
script prints and until the command exits, for each launcher on the same tiny script. Runs
are interleaved (one of each launcher per round) so that machine load hits all alike, and
the median of --runs rounds is printed with each launcher's overhead over torchrun.

    uv run --frozen --group bench python tools/bench/bench_launch.py [--runs 3] [--import-torch]

accelerate is launched with `--multi_gpu` (its torchrun path): its `--cpu` path starts a
single process unless mpirun is set up. The script prints before importing anything, so the
numbers are the launchers' own cost; --import-torch makes it import torch first.
Target: accel adds at most 0.2 s over torchrun.

--first-step instead times an ordinary accelerate command, `launch --num_processes 2
--dynamo_backend no --mixed_precision no train.py`, run by `accel launch` on a script that
imports accel and by `accelerate launch` on the same script importing accelerate: the time
until rank 0 has prepared a model, optimizer and dataloader and finished one training step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = 'print("first line", flush=True)\n'
SCRIPT_TORCH = 'import torch\nprint("first line", flush=True)\n'
ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
machine_rank: 0
mixed_precision: 'no'
num_machines: 1
num_processes: {n}
use_cpu: false
"""


FIRST_STEP = """\
import torch
from {lib} import Accelerator

acc = Accelerator()
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model, opt, loader = acc.prepare(model, opt, loader)
x, y = next(iter(loader))
acc.backward(torch.nn.functional.mse_loss(model(x), y))
opt.step()
if acc.is_main_process:
    print("first step", flush=True)
acc.wait_for_everyone()
"""
ORDINARY = ["--num_processes", "2", "--dynamo_backend", "no", "--mixed_precision", "no"]


def first_step_commands(workdir: Path) -> dict[str, list[str]]:
    """The same ordinary launch command, by accel and (when installed) by accelerate."""
    cmds: dict[str, list[str]] = {}
    for name, lib in (("accel launch", "accel"), ("accelerate launch", "accelerate")):
        exe = tool(name.split()[0])
        if exe is None:
            continue
        script = workdir / f"train_{lib}.py"
        script.write_text(FIRST_STEP.format(lib=lib))
        cmds[name] = [exe, "launch", *ORDINARY, "--main_process_port", "{port}", str(script)]
    if "accelerate launch" in cmds:
        # Without GPUs accelerate runs the ordinary command as ONE process (its simple
        # launcher); --multi_gpu makes it start the 2 processes through torchrun, as accel does.
        exe, launch, *rest = cmds["accelerate launch"]
        cmds["accelerate --multi_gpu"] = [exe, launch, "--multi_gpu", *rest]
    return cmds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tool(name: str) -> str | None:
    """The console script installed next to this Python, if there is one."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else shutil.which(name)


def commands(script: Path, nproc: int, workdir: Path) -> dict[str, list[str]]:
    cmds: dict[str, list[str]] = {}
    torchrun = tool("torchrun") or None
    base = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    cmds["torchrun"] = [
        *base,
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        "{port}",
        str(script),
    ]
    accel = tool("accel")
    base = [accel] if accel else [sys.executable, "-m", "accel_cli.main"]
    cmds["accel launch"] = [
        *base, "launch", "--num_processes", str(nproc), "--cpu", "--main_process_port", "{port}",
        str(script),
    ]  # fmt: skip
    accelerate = tool("accelerate")
    if accelerate:
        config = workdir / "accelerate.yaml"
        config.write_text(ACCELERATE_CONFIG.format(n=nproc))
        cmds["accelerate launch"] = [
            accelerate, "launch", "--config_file", str(config), "--multi_gpu",
            "--num_processes", str(nproc), "--main_process_port", "{port}", str(script),
        ]  # fmt: skip
    return cmds


def time_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the first line on stdout, seconds to exit)."""
    port = str(free_port())
    argv = [port if part == "{port}" else part for part in cmd]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    first_line = proc.stdout.readline()
    first = time.perf_counter() - start
    proc.stdout.read()
    code = proc.wait()
    total = time.perf_counter() - start
    if code != 0 or not first_line:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {code}")
    return first, total


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--nproc", type=int, default=2, help="processes per launch")
    parser.add_argument("--import-torch", action="store_true", help="script imports torch first")
    parser.add_argument(
        "--first-step", action="store_true", help="time launch to the first training step"
    )
    args = parser.parse_args()

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCEL_CONFIG_FILE", None)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        env["XDG_CONFIG_HOME"] = str(workdir / "xdg")  # no user config file in the way
        env["HF_HOME"] = str(workdir / "hf")  # nor accelerate's
        if args.first_step:
            return report_first_step(first_step_commands(workdir), env, args.runs)
        script = workdir / "first_line.py"
        script.write_text(SCRIPT_TORCH if args.import_torch else SCRIPT)
        cmds = commands(script, args.nproc, workdir)
        for cmd in cmds.values():  # warm the file cache once
            time_once(cmd, env)
        firsts: dict[str, list[float]] = {name: [] for name in cmds}
        totals: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                first, total = time_once(cmd, env)
                firsts[name].append(first)
                totals[name].append(total)

    base_first = statistics.median(firsts["torchrun"])
    base_total = statistics.median(totals["torchrun"])
    print(
        f"{args.nproc} processes, median of {args.runs} runs"
        + (", script imports torch" if args.import_torch else "")
    )
    print(
        f"{'launcher':<20}{'first line s':>13}{'over torchrun':>15}{'ratio':>8}{'exit s':>9}{'ratio':>8}"
    )
    for name in cmds:
        first = statistics.median(firsts[name])
        total = statistics.median(totals[name])
        print(
            f"{name:<20}{first:>13.3f}{first - base_first:>+15.3f}{first / base_first:>8.2f}"
            f"{total:>9.3f}{total / base_total:>8.2f}"
        )
    if "accelerate launch" not in cmds:
        print("accelerate not installed: run with `uv run --frozen --group bench`")


def report_first_step(cmds: dict[str, list[str]], env: dict[str, str], runs: int) -> None:
    for cmd in cmds.values():  # warm the file cache once
        time_once(cmd, env)
    firsts: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            firsts[name].append(time_once(cmd, env)[0])
    print(f"launch to first training step, `launch {' '.join(ORDINARY)}`, median of {runs} runs")
    for name in cmds:
        print(f"{name:<20}{statistics.median(firsts[name]):>8.3f} s")
    accel = statistics.median(firsts["accel launch"])
    for other in ("accelerate launch", "accelerate --multi_gpu"):
        if other in cmds:
            print(f"accel launch / {other}: {accel / statistics.median(firsts[other]):.2f}")
    if "accelerate launch" not in cmds:
        print("accelerate not installed: run with `uv run --frozen --group bench`")


if __name__ == "__main__":
    main()
