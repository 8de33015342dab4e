"""This machine on the network: its address and interface on the route to another machine,
the socket-interface variables gloo and NCCL read, and whether a machine still answers.

One rule for the launcher (`accel launch` picks the interface its workers talk on) and the
workers (the hang doctor tells a lost machine from a stuck process; the fault-tolerant engine
points gloo across replica groups): the address the kernel would use toward the other machine
(a UDP socket's connect picks a route and sends nothing), and the interface that holds it.

Public and torch-free (stdlib and psutil only): the launcher imports it before any worker starts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import socket
from collections.abc import Mapping, Sequence

__all__ = [
    "ENV_GLOO_SOCKET_IFNAME",
    "ENV_MASTER_ADDR",
    "ENV_NCCL_SOCKET_IFNAME",
    "PROBE_SECONDS",
    "SOCKET_IFNAME_VARIABLES",
    "address_on",
    "address_toward",
    "host_address",
    "interface_of",
    "interfaces",
    "probe",
    "ranges",
    "resolve_address",
    "socket_interface_env",
    "source_address",
]

ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
ENV_NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
SOCKET_IFNAME_VARIABLES = (ENV_GLOO_SOCKET_IFNAME, ENV_NCCL_SOCKET_IFNAME)
PROBE_SECONDS = 2.0
# A port nothing listens on: a machine that is up refuses it at once.
_PROBE_PORT = 9


def resolve_address(host: str) -> str:
    """The IPv4 (else IPv6) address of `host`, a name or an address; socket.gaierror when it
    does not resolve."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def source_address(address: str) -> str:
    """This machine's address on the route to `address` (an address, not a name), asked of the
    kernel without sending anything; OSError (ENETUNREACH, ...) when no route leads there."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with contextlib.closing(socket.socket(family, socket.SOCK_DGRAM)) as sock:
        sock.connect((address, _PROBE_PORT))
        return str(sock.getsockname()[0])


def address_toward(host: str) -> str | None:
    """This machine's address on the route to `host` (a name or an address); None when `host`
    does not resolve or no route leads to it."""
    with contextlib.suppress(OSError):
        return source_address(resolve_address(host))
    return None


def interfaces() -> dict[str, list[tuple[str, str | None]]]:
    """Each interface of this machine: its (address, netmask) pairs, IPv4 and IPv6."""
    import psutil

    out: dict[str, list[tuple[str, str | None]]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                out.setdefault(name, []).append((addr.address.split("%")[0], addr.netmask))
    return out


def interface_of(address: str) -> str | None:
    """The name of this machine's interface that holds `address` (None: none does)."""
    for name, addrs in interfaces().items():
        if any(a == address for a, _ in addrs):
            return name
    return None


def address_on(interface: str) -> str | None:
    """This machine's first IPv4 (else IPv6) address on `interface`."""
    addrs = [a for a, _ in interfaces().get(interface, [])]
    addrs.sort(key=lambda a: ":" in a)
    return addrs[0] if addrs else None


def socket_interface_env(
    interface: str | None,
    environ: Mapping[str, str],
    variables: Sequence[str] = SOCKET_IFNAME_VARIABLES,
) -> dict[str, str]:
    """The socket-interface variables to add so that gloo (and NCCL) talk on `interface`: each
    of `variables` that `environ` does not set already (the user's choice, or the launcher's,
    wins); none when `interface` is None. Left to itself gloo binds the address its host name
    resolves to, often 127.0.0.1; NCCL the first interface by name prefix."""
    if interface is None:
        return {}
    return {name: interface for name in variables if not environ.get(name)}


def host_address() -> str:
    """This machine's address on the route to the main one ($MASTER_ADDR), else the
    address its host name resolves to."""
    main = os.environ.get(ENV_MASTER_ADDR, "")
    local = address_toward(main) if main else None
    if local is not None:
        return local
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return socket.gethostname()


def _answers(address: str) -> str:
    try:
        socket.create_connection((address, _PROBE_PORT), timeout=PROBE_SECONDS).close()
    except ConnectionRefusedError:
        return "answers"
    except OSError as err:
        if err.errno == errno.ECONNREFUSED:
            return "answers"
        return "silent"
    return "answers"


def probe(addresses: list[str]) -> dict[str, str]:
    """address -> "answers" (the machine is up: something refused or accepted a connection)
    or "silent" (nothing came back within PROBE_SECONDS: its link or the machine is down),
    all probed at once."""
    if not addresses:
        return {}
    with concurrent.futures.ThreadPoolExecutor(len(addresses)) as pool:
        return dict(zip(addresses, pool.map(_answers, addresses)))


def ranges(numbers: Sequence[int], most: int = 8) -> str:
    """Ranks (or machine ranks) for a message about many hosts: sorted and distinct, runs of
    three or more as a range ("0-5, 8, 9, 12-15"), the first `most` runs, then "and K more"."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    parts: list[str] = []
    for first, last in runs:
        if last - first >= 2:
            parts.append(f"{first}-{last}")
        else:
            parts.extend(str(n) for n in range(first, last + 1))
    text = ", ".join(parts[:most])
    return text if len(parts) <= most else f"{text} and {len(parts) - most} more"
