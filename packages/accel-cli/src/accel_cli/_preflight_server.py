"""The preflight's server, on the main machine: listen on the main port, greet each launcher
(`MAGIC`), collect one line of facts from each, answer all with one verdict, close.

One thread serves every connection as it comes (a selector), so a slow or silent client
holds up no other and the listen queue, as long as the world, drains as fast as machines
connect. At N machines it does O(N) work and sends O(N) bytes in all: each answer carries
the problems, the number of hosts and the first few of them, never every host's facts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable

from accel_cli._launch_config import LaunchConfig
from accel_cli._preflight_verdict import SHOWN, few, host_label, ranges, verdict

MAGIC = "accel-preflight 2"  # 2: the answer carries a count and the first hosts, not every host
# The waiting hosts and the missing ones are named every WAIT_NOTE_SECONDS while the server
# waits.
WAIT_NOTE_SECONDS = 10.0
_SETTLE_SECONDS = 1.0
# Once a machine rank is claimed twice the launch cannot work, but the verdict waits until
# no launcher arrived for this long, so that the machines started with it hear it too (a
# launcher that comes after the port closed waits for its own timeout).
_QUIET_SECONDS = 3.0
_GREET_SECONDS = 10.0  # a connection that sends no facts by then is not one of our launchers
_FACTS_LIMIT = 1 << 20  # bytes of one host's facts, at most


@dataclasses.dataclass
class _Arrivals:
    """What machine 0 has collected so far, with running tallies (O(1) per arrival)."""

    ranked: bool
    num_machines: int
    clients: list[tuple[socket.socket, dict]] = dataclasses.field(default_factory=list)
    ranks: set[int] = dataclasses.field(default_factory=set)
    duplicate: bool = False
    last: float = dataclasses.field(default_factory=time.monotonic)  # the latest arrival

    def add(self, conn: socket.socket, facts: dict) -> None:
        rank = int(facts["machine_rank"])
        self.last = time.monotonic()
        self.duplicate = self.duplicate or (self.ranked and rank in self.ranks)
        if 0 <= rank < self.num_machines:
            self.ranks.add(rank)
        self.clients.append((conn, facts))

    @property
    def hosts(self) -> list[dict]:
        return [f for _, f in self.clients]

    @property
    def complete(self) -> bool:
        if self.ranked:
            return len(self.ranks) >= self.num_machines
        return len(self.clients) >= self.num_machines


class _Server:
    """The main machine's side: listen on the main port, collect, answer, close.

    One thread serves every connection as it comes (a selector): a connection is accepted
    and greeted at once and its facts read whenever they arrive, so a slow or silent
    client holds up no other, and the listen queue drains as fast as machines connect."""

    def __init__(
        self,
        listener: socket.socket,
        config: LaunchConfig,
        *,
        strict: bool,
        timeout: float,
        ranked: bool,
        say: Callable[[str], None],
    ) -> None:
        self.listener = listener
        self.config, self.strict, self.timeout, self.ranked = config, strict, timeout, ranked
        self.say = say
        self.thread = threading.Thread(target=self._serve, name="accel-preflight", daemon=True)

    def _serve(self) -> None:
        arrivals = _Arrivals(self.ranked, self.config.num_machines)
        deadline = time.monotonic() + self.timeout
        next_note = time.monotonic() + WAIT_NOTE_SECONDS
        settle_until: float | None = None
        greeting: dict[socket.socket, tuple[bytearray, float]] = {}  # conn -> (read, since)
        selector = selectors.DefaultSelector()
        self.listener.setblocking(False)
        selector.register(self.listener, selectors.EVENT_READ)
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                if arrivals.duplicate and not greeting and now - arrivals.last >= _QUIET_SECONDS:
                    break
                if arrivals.complete and (
                    not arrivals.duplicate or len(arrivals.clients) > self.config.num_machines
                ):
                    settle_until = settle_until or now + _SETTLE_SECONDS
                    if now >= settle_until:
                        break
                if now >= next_note:
                    next_note = now + WAIT_NOTE_SECONDS
                    self.say(self._waiting_note(arrivals, deadline - now))
                for key, _ in selector.select(timeout=0.2):
                    if key.fileobj is self.listener:
                        _accept_all(self.listener, selector, greeting)
                    else:
                        conn = key.fileobj
                        assert isinstance(conn, socket.socket)
                        facts = _read_facts(conn, greeting, selector)
                        if facts is not None:
                            arrivals.add(conn, facts)
                for conn, (_, since) in list(greeting.items()):
                    if now - since > _GREET_SECONDS:  # not one of our launchers
                        _drop(conn, greeting, selector)
            self._answer(arrivals)
        finally:
            for conn in list(greeting):
                _drop(conn, greeting, selector)
            selector.close()
            self.listener.close()

    def _answer(self, arrivals: _Arrivals) -> None:
        hosts = arrivals.hosts
        found = verdict(
            hosts,
            self.config,
            strict=self.strict,
            complete=arrivals.complete,
            ranked=self.ranked,
        )
        first = sorted(hosts, key=lambda f: int(f["machine_rank"]))[:SHOWN]
        answer = {
            "problems": [dataclasses.asdict(p) for p in found],
            "host_count": len(hosts),
            "hosts": first,
        }
        line = (json.dumps(answer) + "\n").encode()
        for conn, _ in arrivals.clients:
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.settimeout(5.0)
                conn.sendall(line)
        # Each client closes first, so that the port's TIME_WAIT stays on the clients and
        # torchrun can listen on it here at once.
        for conn, _ in arrivals.clients:
            with contextlib.suppress(OSError):
                conn.recv(16)
            conn.close()

    def _waiting_note(self, arrivals: _Arrivals, left: float) -> str:
        hosts = arrivals.hosts
        first = sorted(hosts, key=lambda f: int(f["machine_rank"]))[: SHOWN + 1]
        arrived = few([host_label(f) for f in first], len(hosts)) or "none yet"
        if self.ranked:
            missing = [r for r in range(self.config.num_machines) if r not in arrivals.ranks]
            waiting = f"machine_rank {ranges(missing)}"
        else:
            waiting = f"{self.config.num_machines - len(hosts)} more host(s)"
        return f"waiting for {waiting} (arrived: {arrived}); giving up in {left:.0f} s"


def _accept_all(
    listener: socket.socket,
    selector: selectors.BaseSelector,
    greeting: dict[socket.socket, tuple[bytearray, float]],
) -> None:
    """Accept every connection waiting, say who we are to each, and wait for its facts."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # out of file descriptors, or the client already gone
            return
        try:
            conn.setblocking(False)
            conn.send((MAGIC + "\n").encode())  # a few bytes: the socket's buffer takes them
        except OSError:
            conn.close()
            continue
        greeting[conn] = (bytearray(), time.monotonic())
        selector.register(conn, selectors.EVENT_READ)


def _read_facts(
    conn: socket.socket,
    greeting: dict[socket.socket, tuple[bytearray, float]],
    selector: selectors.BaseSelector,
) -> dict | None:
    """Read what `conn` sent; its facts once their line is whole (None until then, and for a
    connection that is not one of our launchers, which is closed)."""
    data, _ = greeting[conn]
    try:
        chunk = conn.recv(65536)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        chunk = b""
    data += chunk
    end = data.find(b"\n")
    if not chunk or len(data) > _FACTS_LIMIT or (end < 0 and not chunk):
        _drop(conn, greeting, selector)
        return None
    if end < 0:
        return None
    selector.unregister(conn)
    del greeting[conn]
    try:
        facts = json.loads(bytes(data[:end]))
        int(facts["machine_rank"])
    except (ValueError, KeyError, TypeError):
        conn.close()
        return None
    return facts if isinstance(facts, dict) else None


def _drop(
    conn: socket.socket,
    greeting: dict[socket.socket, tuple[bytearray, float]],
    selector: selectors.BaseSelector,
) -> None:
    with contextlib.suppress(KeyError, ValueError):
        selector.unregister(conn)
    greeting.pop(conn, None)
    conn.close()


def _read_line(conn: socket.socket, limit: int = 1 << 20) -> str:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("line too long")
    return data.decode().strip()


def _listen(port: int, family: int, machines: int = 1) -> socket.socket:
    """Listen on `port` with room in the queue for every machine connecting at once (the
    kernel caps it at net.core.somaxconn): a full queue drops SYNs, and a launcher whose
    connection gets no answer for UNANSWERED_SECONDS gives up."""
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    listener.listen(max(64, machines + 8))
    return listener
