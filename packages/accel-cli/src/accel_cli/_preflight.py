"""The preflight of a multi-machine launch: the mistakes that would make the rendezvous wait
(or fail after minutes) found before any worker starts, each named with the host, the value
and the fix.

Every machine's launcher checks its own side (the main machine's address resolves and is
routed to, the interface that reaches it), then the machines meet on the main port itself
before torchrun uses it: machine 0 (static rendezvous) or the machine that holds the address
(c10d) listens there, says who it is (`MAGIC`), and collects one line of facts from each
machine: its rank, address, the world shape and the training settings it would launch. When
every rank has arrived (or a rank is claimed twice, or the timeout passes) it answers every
machine with one verdict: the problems, each marked fatal or not, the number of hosts and the
first few of them. Then it closes the port, and each launcher either starts torchrun or exits
with `PREFLIGHT_EXIT_CODE`. The wire format is one JSON object per line; nothing but the
launchers of one run speak it.

The verdict is _preflight_verdict's, the main machine's server _preflight_server's. At N
machines machine 0 does O(N) work and sends O(N) bytes in all: each answer names at most a
few hosts per problem, so its size does not grow with N (tools/bench/bench_scale.py, paths
`preflight` and `preflight_dup`, measures both to thousands of machines).

No torch import and no thread left behind: the launcher starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import socket
import sys
import time
from collections.abc import Callable, Mapping

from accel_cli._launch_config import LaunchConfig
from accel_cli._network import (
    NetworkError,
    Route,
    address_on,
    describe_interfaces,
    is_local,
    route_to,
    user_interface,
)
from accel_cli._preflight_server import MAGIC, WAIT_NOTE_SECONDS, _listen, _read_line, _Server
from accel_cli._preflight_verdict import (
    TRAINING_KEYS,
    WORLD_KEYS,
    Problem,
    few,
    host_facts,
    host_label,
    ranges,
    verdict,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAGIC",
    "PREFLIGHT_EXIT_CODE",
    "TRAINING_KEYS",
    "UNANSWERED_SECONDS",
    "WAIT_NOTE_SECONDS",
    "WORLD_KEYS",
    "Outcome",
    "Problem",
    "few",
    "host_facts",
    "host_label",
    "preflight_wanted",
    "ranges",
    "report",
    "run_preflight",
    "verdict",
]

# The launcher's exit code when the preflight finds a launch that cannot work (sysexits'
# EX_CONFIG).
PREFLIGHT_EXIT_CODE = 78
# As long as torchrun's own rendezvous waits by default, so that hosts started minutes apart
# by hand still meet (the preflight is never stricter than the launch it guards); the
# waiting hosts and the missing ones are named every WAIT_NOTE_SECONDS meanwhile.
DEFAULT_TIMEOUT = 900.0
_CONNECT_SECONDS = 3.0
# A main address from which nothing at all comes back (no refusal: no machine holds it, or a
# firewall drops the port) for this long is a mistake, not a machine still starting: a
# machine that is up refuses a connection to a port nothing listens on yet.
UNANSWERED_SECONDS = 6.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The preflight's result on this host."""

    problems: tuple[Problem, ...]
    interface: str | None
    route: Route | None
    hosts: tuple[dict, ...] = ()  # the first hosts (up to SHOWN), by machine rank
    host_count: int = 0  # how many hosts met (0: as many as `hosts`)

    @property
    def fatal(self) -> bool:
        return any(p.fatal for p in self.problems)


def _holder(port: int) -> str:
    """Which process listens on `port` here, when psutil can tell."""
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    with contextlib.suppress(psutil.Error):
                        proc = psutil.Process(conn.pid)
                        return f" (pid {conn.pid}: {' '.join(proc.cmdline()[:4])})"
                return ""
    return ""


def _answers(address: str, port: int) -> bool:
    """Whether `address:port` accepts a connection by the routed interface."""
    try:
        socket.create_connection((address, port), timeout=_CONNECT_SECONDS).close()
    except OSError:
        return False
    return True


def _connect(
    route: Route,
    port: int,
    source: str | None,
    deadline: float,
    me: str,
    say: Callable[[str], None],
) -> socket.socket | Problem:
    """Connect to the main port until `deadline`, from `source` when the user chose the
    interface; a Problem when the main machine cannot be reached."""
    target = f"{route.main_address}:{port}"
    started = time.monotonic()
    noted, unreachable, silent_since = False, 0, None
    while True:
        attempt = time.monotonic()
        try:
            return socket.create_connection(
                (route.main_address, port),
                timeout=_CONNECT_SECONDS,
                source_address=(source, 0) if source else None,
            )
        except OSError as err:
            code, why = err.errno, err.strerror or "no answer"
        now = time.monotonic()
        if code == errno.ECONNREFUSED:
            silent_since, why = None, "nothing listens there yet"  # its launcher is late
        else:
            if source is not None and _answers(route.main_address, port):
                return Problem(me, _wrong_interface(source, target, route))
            silent_since = silent_since or attempt
            unreachable += code in (errno.EHOSTUNREACH, errno.ENETUNREACH)
        if unreachable >= 2 or (
            silent_since is not None and now - silent_since >= UNANSWERED_SECONDS
        ):
            return Problem(me, (
                f"no host answers at main_process_ip {route.main_address}: for "
                f"{now - started:.0f} s neither a refusal nor an answer came back (no machine "
                f"holds that address, or a firewall drops port {port}; {describe_interfaces()}). "
                f"Give machine 0's address as --main_process_ip."
            ))  # fmt: skip
        if now >= deadline:
            return Problem(me, (
                f"nothing answered on {target} ({why}) before the preflight timeout: machine 0 "
                f"was not started, or --main_process_ip/--main_process_port do not name it."
            ))  # fmt: skip
        if not noted and now - started > 5.0:
            noted = True
            say(f"waiting for machine 0 at {target}: {why} (is machine_rank 0 started, and is "
                f"{route.main_address} its address?)")  # fmt: skip
        time.sleep(0.2)


def _wrong_interface(source: str, target: str, route: Route) -> str:
    return (
        f"the interface chosen for the run's traffic ({source}) cannot reach machine 0 at "
        f"{target}, which answers by {route.interface} ({route.local_address}). Unset "
        f"GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME or set them to {route.interface}."
    )


def run_preflight(
    config: LaunchConfig,
    environ: Mapping[str, str],
    *,
    strict: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    say: Callable[[str], None] | None = None,
) -> Outcome:
    """Check this host's side, meet the other machines on the main port, return what was
    found (every host returns the same list of shared problems)."""
    say = say or (lambda text: print(f"accel preflight: {text}", file=sys.stderr, flush=True))
    me = f"host {config.machine_rank} ({socket.gethostname()})"
    assert config.main_process_ip and config.main_process_port, "call with_rendezvous first"
    try:
        route = route_to(config.main_process_ip)
        chosen = user_interface(environ)
    except NetworkError as err:
        return Outcome((Problem(me, str(err)),), None, None)
    interface = chosen[1] if chosen else route.interface
    source = address_on(chosen[1]) if chosen else None
    problems: list[Problem] = []
    multi = config.num_machines > 1
    if multi and route.loopback:
        # A warning: several launchers on one machine (a test cluster) do meet on loopback.
        problems.append(Problem(me, (
            f"main_process_ip {config.main_process_ip} is a loopback address: if the machines "
            f"are separate, only this one reaches it and each would form a world of its own. "
            f"Give machine 0's network address (such as $(hostname -I | cut -d' ' -f1) on it, "
            f"or the first node of $SLURM_JOB_NODELIST)."
        ), fatal=False))  # fmt: skip
    if config.elastic or config.rdzv_backend not in ("static", "c10d"):
        # Hosts of an elastic run join when they come; etcd's endpoint is not a machine.
        return Outcome(tuple(problems), interface, route)
    ranked = config.rdzv_backend == "static"
    port = config.main_process_port
    family = socket.AF_INET6 if ":" in route.main_address else socket.AF_INET
    server = None
    if (config.machine_rank == 0) if ranked else is_local(route.main_address):
        try:
            listener = _listen(port, family, config.num_machines)
        except OSError as err:
            if ranked or err.errno != errno.EADDRINUSE:
                problems.append(
                    Problem(
                        me,
                        (
                            f"main_process_port {port} is already held on machine 0{_holder(port)}: "
                            f"stop that program, or pass another --main_process_port (the same on "
                            f"every machine)."
                            if err.errno == errno.EADDRINUSE
                            else f"cannot listen on main_process_port {port}: {err.strerror}."
                        ),
                    )
                )
                return Outcome(tuple(problems), interface, route)
        else:
            server = _Server(
                listener, config, strict=strict, timeout=timeout, ranked=ranked, say=say
            )
            server.thread.start()
    facts = host_facts(config, source or route.local_address, interface)
    outcome = _meet(route, port, source, facts, me, timeout, say)
    if server is not None:
        server.thread.join(timeout=30)
    if isinstance(outcome, Problem):
        return Outcome((*problems, outcome), interface, route)
    shared = tuple(Problem(**p) for p in outcome["problems"])
    hosts = tuple(outcome["hosts"])
    count = int(outcome.get("host_count", len(hosts)))
    return Outcome((*problems, *shared), interface, route, hosts, count)


def _meet(
    route: Route,
    port: int,
    source: str | None,
    facts: dict,
    me: str,
    timeout: float,
    say: Callable[[str], None],
) -> dict | Problem:
    """Send our facts to the main machine and wait for its verdict."""
    deadline = time.monotonic() + timeout
    conn = _connect(route, port, source, deadline, me, say)
    if isinstance(conn, Problem):
        return conn
    target = f"{route.main_address}:{port}"
    with conn:
        try:
            conn.settimeout(5.0)
            greeting = _read_line(conn, limit=len(MAGIC) + 1)
        except (OSError, ValueError):
            greeting = ""
        if greeting != MAGIC:
            return Problem(
                me,
                (
                    f"something other than machine 0's `accel launch` answers on {target}: another "
                    f"program holds the port, or machine 0 already started the run without this "
                    f"host (is --machine_rank {facts['machine_rank']} given to two machines?). "
                    f"Pass a free --main_process_port, the same on every machine."
                ),
            )
        conn.sendall((json.dumps(facts) + "\n").encode())
        conn.settimeout(max(1.0, deadline - time.monotonic()) + 30.0)
        try:
            answer = json.loads(_read_line(conn))
        except (OSError, ValueError) as err:
            return Problem(
                me,
                f"machine 0 at {target} closed the preflight without an answer "
                f"({err}); see its output.",
            )
    return answer


def report(outcome: Outcome, say: Callable[[str], None]) -> None:
    """Print each problem on its own line, fatal ones first, and what happens next."""
    fatal = [p for p in outcome.problems if p.fatal]
    warnings = [p for p in outcome.problems if not p.fatal]
    if fatal:
        say(f"{len(fatal)} problem(s); no worker was started:")
        for problem in fatal:
            say(f"  {problem.line()}")
    for problem in warnings:
        say(f"warning: {problem.line()}")
    if not fatal and outcome.hosts:
        count = outcome.host_count or len(outcome.hosts)
        hosts = few([host_label(f) for f in outcome.hosts], count)
        via = f" over {outcome.interface}" if outcome.interface else ""
        say(f"ok: {count} host(s) agree ({hosts}); talking{via}")


def preflight_wanted(config: LaunchConfig, flag: str | None) -> bool:
    """On by default for several machines; `flag` is --preflight's value ("on", "strict",
    "off" for --no_preflight, None when neither was given)."""
    if flag == "off":
        return False
    return flag in ("on", "strict") or config.num_machines > 1
