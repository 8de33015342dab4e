"""Checkpoint save / load time of `accel` against raw PyTorch and HuggingFace accelerate.

    uv run --frozen --group bench python tools/bench/bench_checkpoint.py [--size-mb MB]
        [--width W] [--repeat R] [--threads T] [--variants V,...] [--profile VARIANT]

A stack of Linear(W, W) layers of about `--size-mb` MB of fp32 parameters, trained one AdamW
step (so the optimizer holds exp_avg and exp_avg_sq: the state is ~3x the parameter bytes),
with a LinearLR scheduler, is saved and then loaded into fresh objects, four ways:

- raw:        ``torch.save({model, optimizer, scheduler, rng})`` into one file, then
              ``torch.load`` + ``load_state_dict`` into fresh model / optimizer / scheduler;
              NOT fsynced: the bytes may still sit in the page cache when it returns;
- raw_fsync:  the same, with the file and its folder fsynced (durable on return);
- accel:      ``accel.Accelerator(cpu=True)``: prepare, ``save_state(dir)``; a fresh
              Accelerator + objects: ``load_state(dir)`` (safetensors weights, every file
              fsynced, written in a temporary folder renamed into place: durable on return);
- accelerate: the same with ``accelerate.Accelerator(cpu=True)`` (when importable); its
              save_state does not fsync, so it compares with raw, accel with raw_fsync;
- accel_async: accel's ``save_state(async_save=True)`` after one untimed asynchronous save
              (as a loop that saves every N steps: the CPU staging buffers are reused); save
              = until ``wait_for_checkpoint()`` returns, and the time the loop is held is
              reported against accel's synchronous save.

Then the durable-write floor: accel's checkpoint size written as N files from N threads
(N = 1, 2, 4, 8; 16 MiB writes) and fsynced with their folder; each durable save is reported
against the single stream and the best N.

Each process builds and trains the model once and measures two variants on it, a raw one and
an Accelerator (one Accelerator library per process: each makes its process state); the
pairs, their order and the order of the processes rotate over `--repeat` rounds, and the table
gives medians. Before each timed save, a file of the checkpoint's size is written and deleted
so the save finds page cache ready to reuse (see `prime_page_cache`). Save is timed from the
call to its return; load likewise, after the fresh objects exist (their construction is not
timed). Load reads what the save just wrote, from the page cache, for every variant alike.
Every run checks that the loaded weights, optimizer state and scheduler equal the saved ones.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

VARIANTS = ("raw", "raw_fsync", "accel", "accel_nofsync", "accel_async", "accelerate")
ACCELERATORS = ("accel", "accel_nofsync", "accel_async", "accelerate")
Objects = tuple[nn.Module, torch.optim.Optimizer, Any]
RESULT_TAG = "BENCH_CHECKPOINT_RESULT "


# -- the objects being saved ---------------------------------------------------------------------
def layer_count(size_mb: float, width: int) -> int:
    """How many Linear(width, width) layers (weight + bias, fp32) make about `size_mb` MB."""
    per_layer = (width * width + width) * 4
    return max(1, round(size_mb * 1e6 / per_layer))


def make_model(width: int, layers: int, init: bool = True) -> nn.Module:
    """`layers` Linear(width, width); `init=False` fills zeros instead of the random init
    (fast: the fresh objects a checkpoint is loaded into get every value from it)."""
    if init:
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    model = nn.Sequential(*(nn.Linear(width, width, device="meta") for _ in range(layers)))
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    return model


def make_training_objects(
    width: int, layers: int, init: bool = True
) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = make_model(width, layers, init)
    # fused: the one training step runs ~3x faster on CPU; the state dict is the same.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=10)
    return model, opt, sched


def train_step(model: nn.Module, opt: Any, sched: Any, width: int) -> None:
    """One step, so that AdamW's state exists; gradients are dropped afterwards (not saved)."""
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(1))
    model(x).pow(2).mean().backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def snapshot(model: nn.Module, opt: torch.optim.Optimizer, sched: Any) -> dict[str, Any]:
    """What a correct load must reproduce (references, not copies: no extra memory)."""
    return {
        "model": dict(model.state_dict()),
        "opt": [opt.state[p] for p in model.parameters()],
        "sched": sched.state_dict(),
    }


def matches(expected: dict[str, Any], model: nn.Module, opt: Any, sched: Any) -> bool:
    """True when the loaded objects hold exactly the saved values."""
    state = model.state_dict()
    if state.keys() != expected["model"].keys():
        return False
    if not all(torch.equal(state[k], v) for k, v in expected["model"].items()):
        return False
    for saved, param in zip(expected["opt"], model.parameters()):
        loaded = opt.state[param]
        if saved.keys() != loaded.keys():
            return False
        if not all(
            torch.equal(torch.as_tensor(saved[k]), torch.as_tensor(loaded[k])) for k in saved
        ):
            return False
    return sched.state_dict() == expected["sched"]


def checkpoint_bytes(objects: Objects) -> int:
    """About what a checkpoint of these objects writes: parameters + optimizer state, +10%."""
    model, opt, _ = objects
    tensors = list(model.parameters()) + [
        v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)
    ]
    return int(1.1 * sum(t.numel() * t.element_size() for t in tensors))


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- the variants: one interface, save() then fresh() then load() -----------------------------


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RawCase:
    """torch.save / torch.load of one dict holding every state dict (fsynced on request)."""

    def __init__(self, trained: Objects, width: int, layers: int, out: Path, fsync: bool) -> None:
        self.trained, self.width, self.layers, self.out, self.fsync = (
            trained, width, layers, out, fsync
        )  # fmt: skip
        self.file = out / "checkpoint.pt"

    def save(self) -> None:
        model, opt, sched = self.trained
        self.out.mkdir(parents=True, exist_ok=True)
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": _rng_state(),
        }
        torch.save(state, self.file)
        if self.fsync:
            _fsync(self.file)
            _fsync(self.out)

    def fresh(self) -> Objects:
        self.loaded: Objects = make_training_objects(self.width, self.layers, init=False)
        return self.loaded

    def load(self) -> None:
        model, opt, sched = self.loaded
        state = torch.load(self.file, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        random.setstate(state["rng"]["python"])
        torch.set_rng_state(state["rng"]["torch"])


class AcceleratorCase:
    """accel's or accelerate's Accelerator: both spell prepare / save_state / load_state alike.
    `acc` prepared the trained objects; a new Accelerator from `factory` loads the checkpoint
    into fresh ones."""

    def __init__(
        self, acc: Any, factory: Callable[[], Any], trained: Objects, width: int, layers: int,
        out: Path,
    ) -> None:  # fmt: skip
        self.acc, self.factory, self.trained = acc, factory, trained
        self.width, self.layers, self.out = width, layers, out

    def save(self) -> None:
        self.acc.save_state(os.fspath(self.out))

    def fresh(self) -> Objects:
        self.new_acc = self.factory()
        model, opt, sched = self.new_acc.prepare(
            *make_training_objects(self.width, self.layers, init=False)
        )
        return self.new_acc.unwrap_model(model), opt.optimizer, sched.scheduler

    def load(self) -> None:
        self.new_acc.load_state(os.fspath(self.out))


class AsyncCase(AcceleratorCase):
    """accel's `save_state(async_save=True)`: the loop waits only while the state is copied to
    CPU memory (`blocks`); the files are written by a background thread (`save` = until
    `wait_for_checkpoint()` returns). One untimed asynchronous save first, as in a loop that
    saves every N steps: the timed one reuses its CPU buffers."""

    def save(self) -> None:
        warm = self.out.parent / (self.out.name + "_first")
        self.acc.save_state(os.fspath(warm), async_save=True)
        self.acc.wait_for_checkpoint()
        shutil.rmtree(warm)
        gc.collect()
        start = time.perf_counter()
        self.acc.save_state(os.fspath(self.out), async_save=True)
        self.blocks = time.perf_counter() - start
        self.acc.wait_for_checkpoint()
        self.total = time.perf_counter() - start


def accelerator_factory(name: str) -> Callable[[], Any]:
    if name in ("accel", "accel_async"):
        import accel

        return lambda: accel.Accelerator(cpu=True)
    if name == "accel_nofsync":  # ProjectConfiguration(fsync=False): no flush, like accelerate
        import accel

        return lambda: accel.Accelerator(
            cpu=True, project_config=accel.ProjectConfiguration(fsync=False)
        )
    import accelerate

    return lambda: accelerate.Accelerator(cpu=True)


def train(width: int, layers: int, factory: Callable[[], Any] | None) -> tuple[Any, Objects]:
    """The objects every variant of a process saves: built, prepared by the Accelerator when
    there is one (single CPU process: the wrappers hold the very same objects), one step."""
    objects = make_training_objects(width, layers)
    if factory is None:
        train_step(*objects, width)
        return None, objects
    acc = factory()
    model, opt, sched = acc.prepare(*objects)
    train_step(model, opt, sched, width)
    return acc, (acc.unwrap_model(model), opt.optimizer, sched.scheduler)


def _timed(fn: Callable[[], None], prof: Any) -> float:
    gc.collect()
    start = time.perf_counter()
    if prof is not None:
        prof.runcall(fn)
    else:
        fn()
    return time.perf_counter() - start


def measure(case: RawCase | AcceleratorCase, name: str, profile: bool) -> dict[str, Any]:
    """Save, then load into fresh objects; seconds of each, bytes written, equality check."""
    prof = _profiler(profile)
    prime_page_cache(case.out.parent / "prime", checkpoint_bytes(case.trained))
    save_s = _timed(case.save, prof)
    if isinstance(case, AsyncCase):  # it times itself, after its untimed first save
        save_s = case.total
    written = folder_bytes(case.out)
    expected = snapshot(*case.trained)
    loaded = case.fresh()
    load_s = _timed(case.load, prof)
    ok = matches(expected, *loaded)
    if prof is not None:
        _print_profile(prof, name)
    result = {"save": save_s, "load": load_s, "bytes": written, "ok": ok}
    if isinstance(case, AsyncCase):
        result["blocks"] = case.blocks
    return result


def warm_up(root: Path) -> None:
    """Pay the first-use costs of a process (lazy imports, first file writes) before timing,
    so a variant run first in its process is not penalized against one run second."""
    from safetensors.torch import load_file, save_file

    root.mkdir(parents=True, exist_ok=True)
    tensor = {"w": torch.randn(256, 256)}
    torch.save(tensor, root / "warm.pt")
    torch.load(root / "warm.pt", weights_only=True)
    save_file(tensor, os.fspath(root / "warm.safetensors"))
    load_file(os.fspath(root / "warm.safetensors"))
    for file in root.iterdir():
        file.unlink()


def prime_page_cache(root: Path, nbytes: int) -> None:
    """Write and delete a file of `nbytes`, so the timed save finds that much page cache
    ready to reuse. On a VM, writing into memory the guest has not used lately can run 5x
    slower than into memory just freed, which made whichever save came first in a process
    slow; after this, every save starts from the same state."""
    chunk = bytes(64 << 20)
    file = root / "prime.bin"
    root.mkdir(parents=True, exist_ok=True)
    with open(file, "wb") as f:
        for _ in range(-(-nbytes // len(chunk))):
            f.write(chunk)
    file.unlink()


def run_child(
    names: list[str], width: int, layers: int, root: Path, profile: bool = False
) -> dict[str, dict[str, Any]]:
    """Measure `names` one after the other in this process, all saving the same trained
    objects; at most one Accelerator library per process (each makes its process state)."""
    libraries = [n for n in names if n in ACCELERATORS]
    assert len(libraries) <= 1, names
    factory = accelerator_factory(libraries[0]) if libraries else None
    acc, trained = train(width, layers, factory)
    warm_up(root / "warm_up")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        out = root / name
        if name in ACCELERATORS:
            assert factory is not None
            kind = AsyncCase if name == "accel_async" else AcceleratorCase
            case: RawCase | AcceleratorCase = kind(acc, factory, trained, width, layers, out)
        else:
            case = RawCase(trained, width, layers, out, fsync=name == "raw_fsync")
        results[name] = measure(case, name, profile)
        del case
        gc.collect()
        shutil.rmtree(out, ignore_errors=True)
    return results


def _profiler(on: bool) -> Any:
    if not on:
        return None
    import cProfile

    return cProfile.Profile()


def _print_profile(prof: Any, name: str) -> None:
    import pstats

    print(f"\ncProfile of {name}: save then load (by cumulative time)", file=sys.stderr)
    stats = pstats.Stats(prof, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(35)
    print(f"\ncProfile of {name}: save then load (by internal time)", file=sys.stderr)
    stats.sort_stats("tottime").print_stats(20)


# -- the parent: spawn, interleave, summarize ---------------------------------------------------
def accelerate_importable() -> bool:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return False
    return True


def spawn(
    names: list[str], args: argparse.Namespace, layers: int, root: Path
) -> dict[str, dict[str, Any]]:
    """Run `names` in a child process; its results come back as a tagged json line."""
    cmd = [
        sys.executable, __file__, "--child", ",".join(names), "--out", os.fspath(root),
        "--width", str(args.width), "--layers", str(layers), "--threads", str(args.threads),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    shutil.rmtree(root, ignore_errors=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"the {names} run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return json.loads(lines[-1][len(RESULT_TAG) :])


def rounds_plan(names: list[str], repeat: int) -> list[list[list[str]]]:
    """Per round, the child processes in order, each pairing a raw variant with an Accelerator
    (so every process builds and trains one model, and accel and accelerate each share a
    process with a raw variant). The pairs, the order inside a pair and the order of the
    processes change from round to round."""
    raws = [n for n in names if n not in ACCELERATORS]
    libs = [n for n in names if n in ACCELERATORS]
    plan = []
    for r in range(repeat):
        rotated = raws[r % len(raws) :] + raws[: r % len(raws)]
        groups = [[raw] + ([libs[i]] if i < len(libs) else []) for i, raw in enumerate(rotated)] + [
            [lib] for lib in libs[len(rotated) :]
        ]
        groups = [g[::-1] if (r // 2) % 2 else g for g in groups]
        plan.append(groups[r % len(groups) :] + groups[: r % len(groups)])
    return plan


def run_all(args: argparse.Namespace, names: list[str], layers: int) -> dict[str, list[dict]]:
    root = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir="/tmp"))
    runs: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for r, groups in enumerate(rounds_plan(names, args.repeat)):
            for i, group in enumerate(groups):
                for name, result in spawn(group, args, layers, root / f"{r}_{i}").items():
                    runs[name].append(result)
                    print(f"  round {r + 1}: {name:10s} save {result['save']:6.2f} s  "
                          f"load {result['load']:6.2f} s", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return runs


# -- the durable-write floor -------------------------------------------------------------------
FLOOR_THREADS = (1, 2, 4, 8)


def durable_write(root: Path, nbytes: int, threads: int) -> float:
    """Seconds to write `nbytes` as `threads` files from as many threads (16 MiB writes from
    one reused buffer each) and fsync them and their folder: what a durable save cannot beat."""
    import threading

    root.mkdir(parents=True, exist_ok=True)
    prime_page_cache(root / "prime", nbytes)
    chunk = memoryview(bytes(16 << 20))
    share = -(-nbytes // threads)

    def write(i: int) -> None:
        fd = os.open(root / f"part_{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = share
            while left > 0:
                left -= os.write(fd, chunk[: min(left, len(chunk))])
            os.fsync(fd)
        finally:
            os.close(fd)

    start = time.perf_counter()
    workers = [threading.Thread(target=write, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    _fsync(root)
    seconds = time.perf_counter() - start
    shutil.rmtree(root)
    return seconds


def measure_floors(nbytes: int, repeat: int) -> dict[str, float]:
    """Median seconds of `durable_write` per thread count, over `repeat` interleaved rounds."""
    root = Path(tempfile.mkdtemp(prefix="bench_checkpoint_floor_", dir="/tmp"))
    times: dict[int, list[float]] = {t: [] for t in FLOOR_THREADS}
    try:
        for r in range(repeat):
            order = (
                FLOOR_THREADS[r % len(FLOOR_THREADS) :] + FLOOR_THREADS[: r % len(FLOOR_THREADS)]
            )
            for t in order:
                times[t].append(durable_write(root / f"w{t}", nbytes, t))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {f"write+fsync x{t}": statistics.median(v) for t, v in times.items()}


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, results in runs.items():
        out[name] = {
            "save": statistics.median(r["save"] for r in results),
            "load": statistics.median(r["load"] for r in results),
            "total": statistics.median(r["save"] + r["load"] for r in results),
            "bytes": results[-1]["bytes"],
            "ok": all(r["ok"] for r in results),
        }
        if "blocks" in results[0]:
            out[name]["blocks"] = statistics.median(r["blocks"] for r in results)
    return out


def print_table(s: dict[str, dict[str, Any]], repeat: int) -> None:
    def ratio(name: str, key: str, base: str) -> str:
        return f"{s[name][key] / s[base][key]:5.2f}"

    print(f"\nmedian of {repeat} runs each (seconds; ratio = variant time / raw's time)")
    head = f"  {'variant':11s} {'save':>7s} {'load':>7s} {'total':>7s} {'MB written':>11s}"
    print(head + "   x raw: save  load total   x raw_fsync: total   loaded == saved")
    for name, v in s.items():
        print(
            f"  {name:11s} {v['save']:7.2f} {v['load']:7.2f} {v['total']:7.2f} "
            f"{v['bytes'] / 1e6:11.1f}         {ratio(name, 'save', 'raw')} "
            f"{ratio(name, 'load', 'raw')} {ratio(name, 'total', 'raw')}"
            f"                {ratio(name, 'total', 'raw_fsync')}   {'yes' if v['ok'] else 'NO'}"
        )
    if "accel_async" in s:
        a = s["accel_async"]
        print(f"  accel_async: the loop waits {a['blocks']:.2f} s (staging in CPU memory), "
              f"{a['blocks'] / s['accel']['save']:.1%} of accel's synchronous save "
              f"({s['accel']['save']:.2f} s); written and durable after {a['save']:.2f} s")  # fmt: skip
    print("  not durable on return (no fsync): raw (torch.save), accelerate (its save_state),")
    print("  accel_nofsync (ProjectConfiguration(fsync=False); still atomic against a crash);")
    print("  durable (fsynced): raw_fsync (file + folder), accel (every file + folders).")
    print("  Like for like: accelerate and accel_nofsync against raw, accel against raw_fsync.")
    if "accelerate" in s and "accel_nofsync" in s:
        a, h = s["accel_nofsync"]["total"], s["accelerate"]["total"]
        verdict = "MET" if a <= h * 1.05 else "MISSED"
        print(f"\ntarget, like for like (neither fsyncs): accel_nofsync no slower than "
              f"accelerate: {a:.2f} s vs {h:.2f} s (x{a / h:.2f})  {verdict}")  # fmt: skip
    if "accelerate" in s:
        a, h = s["accel"]["total"], s["accelerate"]["total"]
        verdict = "MET" if a <= h * 1.05 else "MISSED"
        print(f"target, durable accel (fsync) vs accelerate (no fsync): "
              f"{a:.2f} s vs {h:.2f} s (x{a / h:.2f})  {verdict}")  # fmt: skip


def print_floors(floors: dict[str, float], s: dict[str, dict[str, Any]], nbytes: int) -> None:
    best = min(floors, key=floors.__getitem__)
    print(f"\ndurable-write floor: {nbytes / 1e6:.0f} MB (accel's checkpoint) written as N files "
          f"from N threads + fsync, median of the rounds")  # fmt: skip
    for name, sec in floors.items():
        print(f"  {name:18s} {sec:6.2f} s  {nbytes / sec / 1e9:5.2f} GB/s")
    single, par = floors["write+fsync x1"], floors[best]
    print(f"  saves against it (single stream {single:.2f} s; best, {best}, {par:.2f} s):")
    for name in ("raw_fsync", "accel", "accel_async"):
        if name in s:
            save = s[name]["save"]
            print(f"    {name:12s} save {save:6.2f} s = x{save / single:.2f} single stream, "
                  f"x{save / par:.2f} best parallel")  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=600, help="fp32 parameter MB (default 600)")
    p.add_argument("--width", type=int, default=2048, help="Linear width (default 2048)")
    p.add_argument("--repeat", type=int, default=3, help="runs per variant (median; default 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads per run (default 2)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    p.add_argument("--profile", choices=VARIANTS, help="cProfile one run of one variant")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    return p.parse_args()


def profile_one(args: argparse.Namespace, name: str, layers: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir="/tmp"))
    try:
        torch.set_num_threads(args.threads)
        print(json.dumps(run_child([name], args.width, layers, root, profile=True)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    args = parse_args()
    if args.child:
        torch.set_num_threads(args.threads)
        results = run_child(args.child.split(","), args.width, args.layers, Path(args.out))
        print(RESULT_TAG + json.dumps(results), flush=True)
        return
    layers = layer_count(args.size_mb, args.width)
    if args.profile:
        profile_one(args, args.profile, layers)
        return
    names = [n for n in args.variants.split(",") if n]
    bad = [n for n in names if n not in VARIANTS]
    if bad or "raw" not in names or "raw_fsync" not in names:
        raise SystemExit(f"--variants: got {args.variants!r}; choose from {VARIANTS}, raw and "
                         f"raw_fsync included (the ratios are against them)")  # fmt: skip
    if "accelerate" in names and not accelerate_importable():
        print("(accelerate not importable: run with --group bench to compare against it)")
        names.remove("accelerate")
    params_mb = layers * (args.width**2 + args.width) * 4 / 1e6
    print(f"torch {torch.__version__}, CPU, {args.threads} thread(s); {layers} x "
          f"Linear({args.width}, {args.width}) = {params_mb:.0f} MB fp32 parameters, AdamW "
          f"state ~2x that, LinearLR; a raw variant and an Accelerator per process")  # fmt: skip
    summary = summarize(run_all(args, names, layers))
    print_table(summary, args.repeat)
    nbytes = summary["accel"]["bytes"] if "accel" in summary else summary["raw"]["bytes"]
    print_floors(measure_floors(nbytes, args.repeat), summary, nbytes)


if __name__ == "__main__":
    main()
