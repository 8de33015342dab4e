"""A world of thousands of machines and ranks on one machine, on loopback: what the control
plane's scale benchmarks (tools/bench/_scale_control.py) and their small-N tests share.

The code under measure is real (the caller passes it in); only the other machines and ranks
are simulated, each by what it leaves where accel's code looks for it:

- `raise_fd_limit`: one socket per simulated machine, so the file limit goes to what is needed.
- `LineClients`: N launchers of other machines, asyncio clients (in a child process) each
  from its own loopback address (127.0.0.0/8), speaking a line protocol: connect (again while refused), read the
  server's greeting line, send one line, read the answer line. Per client: bytes, time.
- `loopback_store` and `CountingStore`: a real TCPStore (torch's libuv server) and a wrapper
  that counts each operation and each key read through it.
- `silent_address`: a loopback address and port from which no answer comes back (a listener
  whose accept queue is full drops every further SYN), as from a machine whose link is cut.
- `OpenCounter`: the files a block of code opens (the interpreter's `open` audit event).

Imports no accel package (see the workspace's import contracts) and torch only in
`loopback_store`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "ClientResult",
    "CountingStore",
    "LineClients",
    "OpenCounter",
    "loopback_address",
    "loopback_store",
    "raise_fd_limit",
    "silent_address",
]


# Connection attempts in flight at once, at most: one event loop playing thousands of
# machines would otherwise spend longer than a connect timeout starting them all, and time
# every one of them out (a limit of the simulation, not of the server under measure).
CONNECTING = 1024


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit to `wanted` where allowed (the soft limit up to
    the hard one; the hard one too when running as root), and return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    with contextlib.suppress(ValueError, OSError):
        if wanted > target:  # only root may raise the hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def loopback_address(index: int) -> str:
    """The loopback address of simulated machine `index` (127.0.0.2, 127.0.0.3, ...): each its
    own, so that no two machines share a source port range."""
    n = index + 2
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


@dataclasses.dataclass
class ClientResult:
    """What one simulated client saw: the greeting, the answer (b"" if none came), the bytes
    it sent and received, seconds from its start to the answer, and an error if any."""

    greeting: bytes = b""
    answer: bytes = b""
    sent: int = 0
    received: int = 0
    seconds: float = 0.0
    error: str = ""


async def _client(
    index: int,
    port: int,
    line: bytes,
    clients: _Clients,
    start: asyncio.Event,
    connecting: asyncio.Semaphore,
) -> ClientResult:
    result = ClientResult()
    await start.wait()
    began = time.monotonic()
    deadline = began + clients.timeout
    source = loopback_address(index)
    silent_since: float | None = None
    while True:
        try:
            async with connecting:
                attempt = time.monotonic()
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        "127.0.0.1", port, local_addr=(source, 0), limit=clients.limit
                    ),
                    clients.connect_timeout,
                )
            break
        except (OSError, asyncio.TimeoutError) as err:
            refused = getattr(err, "errno", None) in (errno.ECONNREFUSED, errno.ECONNRESET)
            silent_since = None if refused else (silent_since or attempt)
            late = time.monotonic() > deadline or clients.stopped.is_set()
            unanswered = silent_since is not None and (
                time.monotonic() - silent_since >= clients.give_up_silent
            )
            if late or unanswered:
                result.error = f"connect: {type(err).__name__} {err}"
                return result
            await asyncio.sleep(0.2)  # as a launcher waits for machine 0's listener
    try:
        result.greeting = await asyncio.wait_for(reader.readline(), deadline - time.monotonic())
        writer.write(line)
        await writer.drain()
        result.sent = len(line)
        result.answer = await asyncio.wait_for(reader.readline(), deadline - time.monotonic())
        result.received = len(result.greeting) + len(result.answer)
    except (OSError, ValueError, asyncio.TimeoutError) as err:
        result.error = f"{type(err).__name__}: {err}"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    result.seconds = time.monotonic() - began
    return result


class LineClients:
    """One client per line, in a child process of their own (its own file limit and
    interpreter lock, so that the clients' work does not slow the server under measure):
    `go()` lets them all connect to 127.0.0.1:`port` at once; `stop()` makes those still
    refused give up; `join()` returns one ClientResult per line, in order. `limit`: the
    longest answer line a client reads; `timeout`: seconds each may take. As a launcher does,
    a connection attempt gives up after `connect_timeout` s and is tried again, and a client
    gives up after `give_up_silent` s of attempts that got no answer at all (not even a
    refusal). At most CONNECTING clients connect at once."""

    def __init__(
        self,
        port: int,
        lines: Sequence[bytes],
        *,
        timeout: float = 120.0,
        limit: int = 1 << 26,
        connect_timeout: float = 3.0,
        give_up_silent: float = 6.0,
    ) -> None:
        self.port, self.lines, self.timeout, self.limit = port, list(lines), timeout, limit
        self.connect_timeout, self.give_up_silent = connect_timeout, give_up_silent
        self.stopped = threading.Event()
        settings = [port, timeout, limit, connect_timeout, give_up_silent]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "accel_testkit.scale", *map(str, settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        for line in self.lines:
            assert line.endswith(b"\n") and line.count(b"\n") == 1, "one line each"
            self._proc.stdin.write(line)
        self._proc.stdin.write(b"\n")
        self._proc.stdin.flush()
        ready = self._proc.stdout.readline()
        assert ready == b"ready\n", ready

    def _say(self, word: bytes) -> None:
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.write(word + b"\n")
            self._proc.stdin.flush()

    def go(self) -> None:
        self._say(b"go")

    def stop(self) -> None:
        self._say(b"stop")

    def join(self) -> list[ClientResult]:
        self.go()
        out, _ = self._proc.communicate(timeout=self.timeout + 60)
        rows = json.loads(out)
        return [
            ClientResult(**{**row, "greeting": row["greeting"].encode(),
                            "answer": row["answer"].encode()})
            for row in rows
        ]  # fmt: skip


def _serve_clients(argv: list[str]) -> None:
    """The child of LineClients: read the lines (an empty one ends them), say "ready", start
    the clients at "go", make the refused ones give up at "stop", print the results."""
    port, timeout, limit = int(argv[0]), float(argv[1]), int(argv[2])
    lines = []
    for line in sys.stdin.buffer:
        if line == b"\n":
            break
        lines.append(line)
    raise_fd_limit(len(lines) + 256)
    clients = _Clients(port, timeout, limit, float(argv[3]), float(argv[4]))
    go = threading.Event()

    def commands() -> None:
        for word in sys.stdin.buffer:
            if word.strip() == b"go":
                go.set()
            if word.strip() == b"stop":
                clients.stopped.set()
        go.set()

    async def run() -> list[ClientResult]:
        start = asyncio.Event()
        connecting = asyncio.Semaphore(CONNECTING)
        tasks = [
            asyncio.ensure_future(_client(i, port, line, clients, start, connecting))
            for i, line in enumerate(lines)
        ]
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        start.set()
        return list(await asyncio.gather(*tasks))

    threading.Thread(target=commands, daemon=True).start()
    results = asyncio.run(run())
    rows = [
        {**dataclasses.asdict(r), "greeting": r.greeting.decode(errors="replace"),
         "answer": r.answer.decode(errors="replace")}
        for r in results
    ]  # fmt: skip
    sys.stdout.write(json.dumps(rows))
    sys.stdout.flush()
    os._exit(0)  # not waiting for the thread that reads stdin


@dataclasses.dataclass
class _Clients:
    """The settings the clients of one LineClients share."""

    port: int
    timeout: float
    limit: int
    connect_timeout: float
    give_up_silent: float
    stopped: threading.Event = dataclasses.field(default_factory=threading.Event)


def loopback_store() -> Any:
    """A real TCPStore server (libuv) on a free loopback port."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)


class CountingStore:
    """A store that counts what passes through it: `ops` per operation name (one per round
    trip) and `keys_read` (every key a check, get or multi_get asks for)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ops: collections.Counter[str] = collections.Counter()
        self.keys_read = 0

    @property
    def reads(self) -> int:
        return sum(self.ops[op] for op in ("check", "get", "multi_get"))

    def set(self, key: str, value: str | bytes) -> None:
        self.ops["set"] += 1
        self.store.set(key, value)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self.ops["multi_set"] += 1
        self.store.multi_set(keys, values)

    def add(self, key: str, amount: int) -> int:
        self.ops["add"] += 1
        return self.store.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        self.ops["check"] += 1
        self.keys_read += len(keys)
        return self.store.check(keys)

    def get(self, key: str) -> bytes:
        self.ops["get"] += 1
        self.keys_read += 1
        return self.store.get(key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.ops["multi_get"] += 1
        self.keys_read += len(keys)
        return self.store.multi_get(keys)


@contextlib.contextmanager
def silent_address(port: int = 0) -> Iterator[tuple[str, int]]:
    """(address, port) on loopback from which a connection gets no answer at all: a listener
    with an accept queue of one place, taken, so the kernel drops every further SYN (the
    connecting side times out, as toward a machine whose link is cut). A `port` below 1024
    (a prober's fixed port) needs root."""
    address = "127.255.255.254"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.connect((address, port))
        yield address, port
    finally:
        filler.close()
        listener.close()


class OpenCounter:
    """Counts the files opened inside `with counter:`, per thread name (Python's `open` audit
    event; the hook stays installed, idle, after the block: audit hooks cannot be removed)."""

    _active: list[OpenCounter] = []
    _installed = False

    def __init__(self) -> None:
        self.opened: collections.Counter[str] = collections.Counter()

    @classmethod
    def _hook(cls, event: str, _args: tuple) -> None:
        if event == "open" and cls._active:
            cls._active[-1].opened[threading.current_thread().name] += 1

    def __enter__(self) -> OpenCounter:
        if not OpenCounter._installed:
            sys.addaudithook(OpenCounter._hook)
            OpenCounter._installed = True
        OpenCounter._active.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        OpenCounter._active.remove(self)


if __name__ == "__main__":
    _serve_clients(sys.argv[1:])
