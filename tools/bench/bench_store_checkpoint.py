"""Checkpoints in an S3 object store: accel's `save_state(URL)` / `load_state(URL)` against raw
s3fs moving the same bytes.

    uv run --frozen python tools/bench/bench_store_checkpoint.py [--size-mb MB] [--width W]
        [--repeat R] [--threads T]

The store is moto's real S3 server, started as its own process (``python -m moto.server -H
127.0.0.1 -p PORT``: its CPU is not in this process's GIL; on a 2-core machine the two
processes still share the cores), reached through s3fs as accel reaches it. A stack of
Linear(W, W) layers of about `--size-mb` MB of fp32 parameters, trained one AdamW step (the
optimizer holds exp_avg and exp_avg_sq: the state is ~3x the parameter bytes), with a LinearLR
scheduler, prepared by ``accel.Accelerator(cpu=True)``, is measured in this one process:

- save, accel:    ``save_state("s3://bench/ROUND/accel")``, synchronous (the files written into
                  a private local folder, uploaded by ``accel_bigmodel.stores.upload``, the
                  marker written last), from the call to its return;
- save, raw put:  the floor, the same bytes: the files of a local ``save_state(dir)`` of the same
                  objects (timed as "local", for context) uploaded with one s3fs
                  ``fs.put(list_of_files, list_of_keys)`` to a fresh prefix;
- async stall:    ``save_state(URL, async_save=True)``: the time until it returns (the loop is
                  held: the sentinel request, the copy into CPU staging buffers) against accel's
                  synchronous save; and the background save's time, from the call until
                  ``wait_for_checkpoint()`` returns (called before anything else is timed). One
                  untimed asynchronous save comes first, before the rounds: a loop saving every
                  N steps reuses its staging buffers;
- load, accel:    a fresh Accelerator and fresh (zero-filled, untimed) objects, then
                  ``load_state(URL)`` (download into a local folder, load, folder removed);
- load, raw get:  s3fs ``fs.get(list_of_keys, list_of_files)`` of the raw put's files into a
                  temporary folder, nothing else;
- load, raw get + load: the same download, then ``safetensors.torch.load_file`` /
                  ``torch.load`` and ``load_state_dict`` into fresh objects: the realistic floor
                  (the folder is removed untimed).

Each round saves to fresh prefixes (the asynchronous save's is removed once written, the others
after the loads; untimed); the order of the saves and of the loads rotates from round to round.
The table gives medians over `--repeat` rounds and the ratios, each the median of its per-round
ratios (the machine's load drifts between rounds): raw time / accel time (save and load; target
>= 0.8) and stall / synchronous save (target <= 0.10). The CPU seconds of this process (all its
threads) and of moto's server are read around every timed call. accel's synchronous save is
split into its phases (the requests before the write, the local write, the upload, the marker
and the requests after it) and its load into the download and the rest, timed by wrapping the
store destination's methods and the checkpointer's fetch. Every load is checked to reproduce the
saved weights, optimizer state and scheduler exactly.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_checkpoint import (
    layer_count,
    make_training_objects,
    matches,
    snapshot,
    train_step,
    warm_up,
)

BUCKET = "bench"
SAVES = ("accel", "raw_put", "async")
LOADS = ("accel", "raw_get", "raw_get_load")


# -- the server's CPU time --------------------------------------------------------------------
def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- accel's save split into phases --------------------------------------------------------------
class Phases:
    """Seconds spent in the store destination's steps during one save: `prepare` (old marker
    checked, prefix cleared, sentinel written), `publish` (the upload), `finalize` (listing,
    marker, sentinel removed, rotation); the rest of a synchronous save is the local write.
    And in a load, `download` (the checkpoint fetched into a local folder); the rest is the
    load from that folder and its removal."""

    STEPS = ("prepare", "publish", "finalize", "download")

    def __init__(self) -> None:
        from accel._checkpoint import _checkpointer
        from accel._checkpoint._destination import StoreDestination

        self.spent: dict[str, float] = dict.fromkeys(self.STEPS, 0.0)
        for step in self.STEPS[:3]:
            setattr(StoreDestination, step, self._timed(step, getattr(StoreDestination, step)))
        _checkpointer.fetch_checkpoint = self._timed("download", _checkpointer.fetch_checkpoint)

    def _timed(self, step: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.spent[step] += time.perf_counter() - start

        return timed

    def reset(self) -> None:
        self.spent = dict.fromkeys(self.STEPS, 0.0)


# -- one round ---------------------------------------------------------------------------------
class Bench:
    """The trained objects, this process's Accelerator and s3fs filesystem, and the server's
    process id (whose CPU time is read around every timed call)."""

    def __init__(self, args: argparse.Namespace, layers: int, root: Path, server_pid: int) -> None:
        import s3fs

        import accel

        self.args, self.layers, self.root, self.server_pid = args, layers, root, server_pid
        self.accel = accel
        self.acc = accel.Accelerator(cpu=True)
        objects = make_training_objects(args.width, layers)
        model, opt, sched = self.acc.prepare(*objects)
        train_step(model, opt, sched, args.width)
        self.trained = (self.acc.unwrap_model(model), opt.optimizer, sched.scheduler)
        self.expected = snapshot(*self.trained)
        self.fs = s3fs.S3FileSystem()
        self.phases = Phases()
        warm_up(root / "warm_up")

    def url(self, key: str) -> str:
        return f"s3://{BUCKET}/{key}"

    def timed(self, fn: Callable[[], Any]) -> dict[str, float]:
        """Wall seconds of `fn()`, the CPU seconds this process (all its threads: fsspec's
        event loop included) and moto's server spent meanwhile, and the accel phases in it."""
        gc.collect()
        self.phases.reset()
        cpu, server = own_cpu(), process_cpu(self.server_pid)
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds, "cpu": own_cpu() - cpu,
            "server_cpu": process_cpu(self.server_pid) - server, **self.phases.spent,
        }  # fmt: skip

    # saves
    def local_save(self, out: Path) -> dict[str, float]:
        return self.timed(lambda: self.acc.save_state(os.fspath(out)))

    def accel_save(self, key: str) -> dict[str, float]:
        return self.timed(lambda: self.acc.save_state(self.url(key)))

    def raw_put(self, files: list[Path], key: str) -> dict[str, float]:
        sources = [os.fspath(f) for f in files]
        targets = [f"{BUCKET}/{key}/{f.name}" for f in files]
        result = self.timed(lambda: self.fs.put(sources, targets))
        self.fs.invalidate_cache(f"{BUCKET}/{key}")
        return result

    def async_save(self, key: str) -> dict[str, float]:
        """`stall`: until save_state returns; the rest (`seconds`, CPU): until
        wait_for_checkpoint() returns."""
        stall = 0.0

        def save() -> None:
            nonlocal stall
            start = time.perf_counter()
            self.acc.save_state(self.url(key), async_save=True)
            stall = time.perf_counter() - start
            self.acc.wait_for_checkpoint()

        result = self.timed(save)
        return {**result, "stall": stall}

    def warm_async(self) -> None:
        """The untimed first asynchronous save: its staging buffers are kept for the next."""
        self.acc.save_state(self.url("warm_async"), async_save=True)
        self.acc.wait_for_checkpoint()
        self.fs.rm(f"{BUCKET}/warm_async", recursive=True)

    # loads
    def accel_load(self, key: str) -> dict[str, Any]:
        acc = self.accel.Accelerator(cpu=True)
        model, opt, sched = acc.prepare(
            *make_training_objects(self.args.width, self.layers, init=False)
        )
        result: dict[str, Any] = self.timed(lambda: acc.load_state(self.url(key)))
        result["ok"] = matches(
            self.expected, acc.unwrap_model(model), opt.optimizer, sched.scheduler
        )
        return result

    def raw_get(self, names: list[str], key: str, load: bool) -> dict[str, Any]:
        """`fs.get` of the raw put's files into a new folder; with `load`, then read into
        fresh objects (`download`: the get alone). The folder is removed untimed."""
        from safetensors.torch import load_file

        folder = Path(tempfile.mkdtemp(prefix="raw_get_", dir=self.root))
        sources = [f"{BUCKET}/{key}/{n}" for n in names]
        targets = [os.fspath(folder / n) for n in names]
        fresh = make_training_objects(self.args.width, self.layers, init=False) if load else None
        download = 0.0

        def get() -> None:
            nonlocal download
            start = time.perf_counter()
            self.fs.get(sources, targets)
            download = time.perf_counter() - start
            if fresh is not None:
                model, opt, sched = fresh
                model.load_state_dict(load_file(os.fspath(folder / "model.safetensors")))
                opt.load_state_dict(torch.load(folder / "optimizer.bin", weights_only=True))
                sched.load_state_dict(torch.load(folder / "scheduler.bin", weights_only=True))

        result: dict[str, Any] = self.timed(get)
        result["download"] = download
        result["ok"] = matches(self.expected, *fresh) if fresh is not None else True
        shutil.rmtree(folder)
        return result

    def round(self, r: int) -> dict[str, Any]:
        """One round: a local save (whose files the raw put sends), the three saves in rotated
        order, then the three loads in rotated order; the round's prefixes removed after."""
        local = self.root / f"local_{r}"
        out: dict[str, Any] = {"local": self.local_save(local)}
        files = sorted(p for p in local.iterdir() if p.is_file())
        out["bytes"] = sum(f.stat().st_size for f in files)
        for name in SAVES[r % 3 :] + SAVES[: r % 3]:
            if name == "accel":
                out["save_accel"] = self.accel_save(f"{r}/accel")
            elif name == "raw_put":
                out["save_raw"] = self.raw_put(files, f"{r}/raw")
            else:
                out["async"] = self.async_save(f"{r}/async")
                self.fs.rm(f"{BUCKET}/{r}/async", recursive=True)  # not loaded: the server's
                # storage holds only what the loads read
        out["accel_files"] = len(self.fs.find(f"{BUCKET}/{r}/accel"))
        names = [f.name for f in files]
        for name in LOADS[r % 3 :] + LOADS[: r % 3]:
            if name == "accel":
                out["load_accel"] = self.accel_load(f"{r}/accel")
            elif name == "raw_get":
                out["load_raw"] = self.raw_get(names, f"{r}/raw", load=False)
            else:
                out["load_raw_load"] = self.raw_get(names, f"{r}/raw", load=True)
            gc.collect()
        self.fs.rm(f"{BUCKET}/{r}", recursive=True)
        shutil.rmtree(local)
        return out


def own_cpu() -> float:
    """CPU seconds this process has used so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- summary ------------------------------------------------------------------------------------
def med(rounds: list[dict[str, Any]], case: str, key: str = "seconds") -> float:
    return statistics.median(r[case][key] for r in rounds)


def paired(rounds: list[dict[str, Any]], case: str, base: str, key: str = "seconds") -> float:
    """Median over the rounds of `case`'s time / `base`'s time in the same round (robust to a
    machine whose load drifts from round to round)."""
    return statistics.median(r[case][key] / r[base][key] for r in rounds)


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def print_table(rounds: list[dict[str, Any]], load_before: float, load_after: float) -> None:
    mb = rounds[-1]["bytes"] / 1e6
    save, stall = med(rounds, "save_accel"), med(rounds, "async", "stall")
    load = med(rounds, "load_accel")
    print(f"\nmedian of {len(rounds)} rounds ({mb:.0f} MB, {rounds[-1]['accel_files']} files in "
          f"accel's prefix; load average {load_before:.1f} before, {load_after:.1f} after)")  # fmt: skip
    print(f"  {'':6s} {'':31s} {'wall s':>7s} {'MB/s':>6s} {'CPU s':>6s} {'moto CPU s':>10s}"
          f"   ratio")  # fmt: skip
    rows = [
        ("save", "accel save_state(URL)", "save_accel", ""),
        ("", "raw s3fs put, same files", "save_raw",
         f"raw/accel {paired(rounds, 'save_raw', 'save_accel'):.2f}"),
        ("", "accel save_state(dir), local", "local", "(context)"),
        ("async", "until wait_for_checkpoint()", "async",
         f"x{paired(rounds, 'async', 'save_accel'):.2f} of the sync save"),
        ("load", "accel load_state(URL)", "load_accel", ""),
        ("", "raw s3fs get", "load_raw", f"raw/accel {paired(rounds, 'load_raw', 'load_accel'):.2f}"),
        ("", "raw s3fs get + load", "load_raw_load",
         f"raw/accel {paired(rounds, 'load_raw_load', 'load_accel'):.2f}"),
    ]  # fmt: skip
    for group, what, case, ratio in rows:
        sec = med(rounds, case)
        print(f"  {group:6s} {what:31s} {sec:7.2f} {mb / sec:6.0f} {med(rounds, case, 'cpu'):6.2f} "
              f"{med(rounds, case, 'server_cpu'):10.2f}   {ratio}")  # fmt: skip
    stall_ratio = statistics.median(
        r["async"]["stall"] / r["save_accel"]["seconds"] for r in rounds
    )
    print(f"  async  save_state returns (stall)   {stall:7.2f}"
          f"{'':27s}stall/sync {stall_ratio:.1%}")  # fmt: skip
    phase = {p: med(rounds, "save_accel", p) for p in Phases.STEPS}
    write = save - phase["prepare"] - phase["publish"] - phase["finalize"]
    print(f"  accel's save: requests before {phase['prepare']:.2f} s, local write {write:.2f} s, "
          f"upload {phase['publish']:.2f} s, marker and after {phase['finalize']:.2f} s")  # fmt: skip
    up = med(rounds, "async", "publish")
    rest = med(rounds, "async") - stall - up - med(rounds, "async", "finalize")
    print(f"  accel's asynchronous save: stall {stall:.2f} s, then the staged files written and "
          f"the flag requests {rest:.2f} s, upload {up:.2f} s, marker and after "
          f"{med(rounds, 'async', 'finalize'):.2f} s")  # fmt: skip
    fetch = med(rounds, "load_accel", "download")
    raw_fetch = med(rounds, "load_raw_load", "download")
    print(f"  accel's load: download {fetch:.2f} s, load and cleanup {load - fetch:.2f} s; raw get "
          f"+ load: get {raw_fetch:.2f} s, load {med(rounds, 'load_raw_load') - raw_fetch:.2f} s")  # fmt: skip
    ok = all(r[c]["ok"] for r in rounds for c in ("load_accel", "load_raw_load"))
    print(f"  loaded == saved (accel, raw get + load, every round): {'yes' if ok else 'NO'}")
    save_ratio = paired(rounds, "save_raw", "save_accel")
    load_ratio = paired(rounds, "load_raw_load", "load_accel")
    print(f"\ntargets (medians of the per-round ratios):\n  save raw/accel >= 0.8: "
          f"{save_ratio:.2f}  {verdict(save_ratio >= 0.8)}")  # fmt: skip
    print(f"  load (raw get + load)/accel >= 0.8: {load_ratio:.2f}  {verdict(load_ratio >= 0.8)} "
          f"(download only: {paired(rounds, 'load_raw', 'load_accel'):.2f})")  # fmt: skip
    print(f"  async stall/sync save <= 0.10: {stall_ratio:.3f}  {verdict(stall_ratio <= 0.10)}")
    print(
        "  (CPU s: this process, all threads; moto CPU s: the server's process. On a machine "
        "whose cores the two share, wall time is bounded below by their sum / cores.)"
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=256, help="fp32 parameter MB (default 256)")
    p.add_argument("--width", type=int, default=2048, help="Linear width (default 2048)")
    p.add_argument("--repeat", type=int, default=3, help="rounds (median; default 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    return p.parse_args()


def main() -> None:
    from _bytecode import compile_workspace

    compile_workspace()
    args = parse_args()
    torch.set_num_threads(args.threads)
    layers = layer_count(args.size_mb, args.width)
    params_mb = layers * (args.width**2 + args.width) * 4 / 1e6
    from accel_testkit.s3 import serve_s3

    root = Path(tempfile.mkdtemp(prefix="bench_store_checkpoint_", dir="/tmp"))
    load_before = os.getloadavg()[0]
    try:
        # moto in its own process: its CPU is not in this process's interpreter lock
        with serve_s3([], "127.0.0.1") as server:
            endpoint, pid = server.endpoint, server.pid
            server.bucket(BUCKET)
            with server.environment():
                print(f"torch {torch.__version__}, CPU, {args.threads} thread(s); {layers} x "
                      f"Linear({args.width}, {args.width}) = {params_mb:.0f} MB fp32 parameters, "
                      f"AdamW state ~2x that, LinearLR; moto's S3 server at {endpoint}, "
                      f"{os.cpu_count()} cores")  # fmt: skip
                bench = Bench(args, layers, root, pid)
                bench.warm_async()
                rounds = []
                for r in range(args.repeat):
                    result = bench.round(r)
                    rounds.append(result)
                    print(f"  round {r + 1}: save accel {result['save_accel']['seconds']:5.2f} s, "
                          f"raw {result['save_raw']['seconds']:5.2f} s, async stall "
                          f"{result['async']['stall']:4.2f} s / all "
                          f"{result['async']['seconds']:5.2f} s; load accel "
                          f"{result['load_accel']['seconds']:5.2f} s, raw get "
                          f"{result['load_raw']['seconds']:5.2f} s, raw get + load "
                          f"{result['load_raw_load']['seconds']:5.2f} s (load average "
                          f"{os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(rounds, load_before, os.getloadavg()[0])


if __name__ == "__main__":
    main()
