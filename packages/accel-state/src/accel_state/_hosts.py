"""Which machine a rank runs on, and whether a machine still answers on the network: what
the hang doctor needs to tell a lost machine from a stuck process.

No traffic but the probe: the address is the one the kernel would use toward the main
machine (a UDP socket's connect picks a route and sends nothing).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import socket

ENV_MASTER_ADDR = "MASTER_ADDR"
PROBE_SECONDS = 2.0
# A port nothing listens on: a machine that is up refuses it at once.
_PROBE_PORT = 9


def address_toward(host: str) -> str | None:
    """This machine's address on the route to `host` (a name or an address), asked of the
    kernel; None when `host` does not resolve or no route leads to it."""
    with contextlib.suppress(OSError):
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        target = str(infos[0][4][0])
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        with contextlib.closing(socket.socket(family, socket.SOCK_DGRAM)) as sock:
            sock.connect((target, _PROBE_PORT))
            return str(sock.getsockname()[0])
    return None


def interface_of(address: str) -> str | None:
    """The name of this machine's interface that holds `address` (None: none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return name
    return None


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
