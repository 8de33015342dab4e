"""Run a function in N real processes on loopback: the helper behind every distributed test.

    results = run_distributed(check_gather, world_size=3)

Each worker gets the environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR=127.0.0.1, a free MASTER_PORT, OMP_NUM_THREADS=1), calls ``fn(*args, **kwargs)``
and sends back its return value (which must pickle). A worker's exception is raised in the
caller with that rank's traceback; a hang is killed after `timeout` seconds and reported as
such, so a broken collective fails a test instead of blocking CI.

`fn` must be a module-level function. Test modules that pytest imports by path work too: the
worker loads the function from its file. torch is imported only inside the workers.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["DistributedTestError", "free_port", "gpu_available", "run_distributed"]


class DistributedTestError(AssertionError):
    """One or more workers failed, crashed or hung; the message holds each rank's story."""


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _function_ref(fn: Callable[..., Any]) -> tuple[str, str, str | None]:
    """(module, qualname, file): installed modules load by name, test files by path."""
    module_name = fn.__module__
    path = getattr(sys.modules.get(module_name), "__file__", None)
    installed = path is None or any(
        part in ("site-packages", "dist-packages") for part in Path(path).parts
    )
    return module_name, fn.__qualname__, None if installed else path


def _load_function(ref: tuple[str, str, str | None]) -> Callable[..., Any]:
    module_name, qualname, path = ref
    if module_name == "__main__":
        # multiprocessing already imported the parent's script as __mp_main__; loading it
        # again as __main__ would run its `if __name__ == "__main__":` block (and recurse).
        module_name = "__mp_main__"
        if module_name in sys.modules:
            path = None
    if path is None:
        target: Any = importlib.import_module(module_name)
    else:
        # Registered under its original name too, so that arguments whose classes live in the
        # same test file unpickle.
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        target = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = target
        spec.loader.exec_module(target)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _worker(
    rank: int,
    world_size: int,
    port: int,
    ref: tuple[str, str, str | None],
    call: bytes,
    env: dict[str, str],
    out_dir: str,
) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
            "OMP_NUM_THREADS": "1",
        }
    )
    os.environ.update(env)
    _exit_with_parent()
    # A process started by torchrun uses the platform's default start method for its own
    # children (DataLoader workers); a spawned worker would inherit "spawn" instead.
    multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)
    try:
        fn = _load_function(ref)
        args, kwargs = pickle.loads(call)
        result: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException:
        result = ("error", traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                _leave_together(wait=result[0] == "ok")
                dist.destroy_process_group()
    try:
        payload = pickle.dumps(result)
    except Exception:
        payload = pickle.dumps(
            ("error", "return value does not pickle:\n" + traceback.format_exc())
        )
    tmp = Path(out_dir) / f"{rank}.tmp"
    tmp.write_bytes(payload)
    tmp.rename(Path(out_dir) / f"{rank}.pkl")


_LEFT = "accel_state.testing/left"  # in the run's own store: how many ranks are done
_LEAVE_WAIT_S = 30.0


def _leave_together(*, wait: bool) -> None:
    """Count this rank done in its process group's store and, when `wait`, wait (at most
    `_LEAVE_WAIT_S`) until every rank of the group is, before this one destroys the group.

    A function that returns right after the group formed would otherwise close its rank's
    connections while a slower peer is still in gloo's connectFullMesh, which then fails that
    peer ("Connection closed by peer"): seen once in CI, for a test that only formed a group. A
    rank whose function raised counts itself done without waiting, so its peers do not wait
    for it; one that hangs or dies makes the others wait out the bound, after which its
    failure is reported as before. A group over a store that is not the run's TCPStore (a fake
    process group's, which no peer shares) has nobody to meet."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if not isinstance(base, dist.TCPStore):
        return
    store.add(_LEFT, 1)
    world_size = dist.get_world_size()
    deadline = time.monotonic() + _LEAVE_WAIT_S
    while wait and store.add(_LEFT, 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.01)


def _exit_with_parent() -> None:
    """A worker whose test process died (killed, timed out) exits instead of lingering in a
    rendezvous or a collective."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="accel-parent-watch", daemon=True).start()


def run_distributed(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` in `world_size` processes; return each rank's result."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    ref = _function_ref(fn)
    child_env = {k: str(v) for k, v in (env or {}).items()}
    call = pickle.dumps((args, kwargs))
    with tempfile.TemporaryDirectory(prefix="accel-dist-") as out_dir:
        procs = [
            ctx.Process(
                target=_worker,
                args=(rank, world_size, port, ref, call, child_env, out_dir),
                daemon=False,
            )
            for rank in range(world_size)
        ]
        # The workers read OMP_NUM_THREADS before importing torch; spawn copies os.environ.
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            for proc in procs:
                proc.start()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        deadline = time.monotonic() + timeout
        first_failure: float | None = None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            if now > deadline:
                break
            failed = any(not p.is_alive() and p.exitcode != 0 for p in procs) or any(
                _is_error(out_dir, r) for r in range(world_size)
            )
            if failed and first_failure is None:
                first_failure = now
            if first_failure is not None and now - first_failure > 10:
                break  # peers of a failed rank are usually stuck in a collective
            time.sleep(0.02)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        results: list[Any] = []
        problems: list[str] = []
        for rank, proc in enumerate(procs):
            path = Path(out_dir) / f"{rank}.pkl"
            if path.exists():
                status, value = pickle.loads(path.read_bytes())
                if status == "ok":
                    results.append(value)
                    continue
                problems.append(f"--- rank {rank} raised:\n{value}")
            elif rank in hung:
                problems.append(
                    f"--- rank {rank} did not finish within {timeout:.0f}s (killed; a hang, "
                    f"or waiting for a failed peer)"
                )
            else:
                problems.append(f"--- rank {rank} exited with code {proc.exitcode} and no result")
            results.append(None)
        if problems:
            raise DistributedTestError(
                f"{len(problems)} of {world_size} workers failed running {ref[1]}:\n"
                + "\n".join(problems)
            )
        return results


def _is_error(out_dir: str, rank: int) -> bool:
    path = Path(out_dir) / f"{rank}.pkl"
    if not path.exists():
        return False
    try:
        return pickle.loads(path.read_bytes())[0] == "error"
    except Exception:
        return False
