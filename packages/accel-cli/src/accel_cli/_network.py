"""Which network interface a multi-machine run talks on, and whether an address is this host's.

gloo and NCCL each pick an interface for their own connections when nothing tells them:
gloo takes the address that this machine's host name resolves to, which is 127.0.0.1 on
many hosts (the other machines then connect to their own loopback and the full mesh fails
with `Connection refused, remote=[127.0.0.1]`); NCCL takes the first interface by name
prefix. The rule here is the one that works wherever the rendezvous works: the interface
that the routing table uses to reach the main machine. `GLOO_SOCKET_IFNAME` /
`NCCL_SOCKET_IFNAME` given by the user win, and are checked to exist.

The rule itself (route, interface, variables) is accel_state.hosts'; this module adds the\nlauncher's checks and messages. No torch import: this runs before any worker starts.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import socket
from collections.abc import Mapping

from accel_state.hosts import (
    ENV_NCCL_SOCKET_IFNAME,
    SOCKET_IFNAME_VARIABLES,
    address_on,
    interface_of,
    interfaces,
    resolve_address,
    source_address,
)
from accel_state.hosts import socket_interface_env as _socket_interface_env

__all__ = [
    "SOCKET_IFNAME_VARIABLES",
    "NetworkError",
    "Route",
    "address_on",
    "describe_interfaces",
    "interface_of",
    "interfaces",
    "is_local",
    "resolve",
    "route_to",
    "socket_interface_env",
    "user_interface",
]


class NetworkError(Exception):
    """The main machine cannot be reached from here, or a named interface is wrong."""


@dataclasses.dataclass(frozen=True)
class Route:
    """How this host reaches the main machine: the main address as resolved, the interface
    the route leaves by and this host's address on it."""

    main_address: str
    interface: str | None
    local_address: str

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.main_address).is_loopback


def resolve(host: str) -> str:
    """The IPv4 (else IPv6) address of `host`, a name or an address."""
    try:
        return resolve_address(host)
    except socket.gaierror as err:
        raise NetworkError(
            f"main_process_ip {host!r} does not resolve to an address ({err.strerror}): give "
            f"machine 0's address, or a name that every machine resolves."
        ) from None


def is_local(address: str) -> bool:
    """Whether `address` is one of this host's own (loopback included)."""
    return ipaddress.ip_address(address).is_loopback or interface_of(address) is not None


def route_to(host: str) -> Route:
    """The route this host would take to `host` (accel_state.hosts' rule: asked of the kernel
    without sending anything), or a NetworkError that says why there is none."""
    address = resolve(host)
    try:
        local = source_address(address)
    except OSError as err:
        if err.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            raise NetworkError(
                f"main_process_ip {host} ({address}) is not reachable from this host: no "
                f"route leads to it ({describe_interfaces()}). Give machine 0's address on "
                f"a network that every machine shares."
            ) from None
        raise
    return Route(address, interface_of(local), local)


def describe_interfaces() -> str:
    """This host's interfaces and addresses, for an error message."""
    parts = [
        f"{name} {', '.join(a for a, _ in addrs)}" for name, addrs in sorted(interfaces().items())
    ]
    return "this host has " + "; ".join(parts) if parts else "this host has no interfaces"


def user_interface(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, interface) of the first socket-interface variable the user set, checked to
    name an interface of this host (gloo accepts one name; NCCL a list or a prefix, which is
    passed on unchecked)."""
    for variable in SOCKET_IFNAME_VARIABLES:
        value = environ.get(variable, "").strip()
        if not value:
            continue
        if variable == ENV_NCCL_SOCKET_IFNAME and any(c in value for c in ",^="):
            continue  # a list or a prefix rule: NCCL's own syntax
        if value not in interfaces():
            raise NetworkError(
                f"{variable}={value} names no interface of this host ({describe_interfaces()}). "
                f"Set it to the interface that reaches machine 0, or unset it and accel picks "
                f"the one the route to machine 0 leaves by."
            )
        return variable, value
    return None


def socket_interface_env(route: Route, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add so that gloo and NCCL use the interface that reaches the main
    machine: none on a loopback rendezvous (one machine), none that the user set."""
    return {} if route.loopback else _socket_interface_env(route.interface, environ)
