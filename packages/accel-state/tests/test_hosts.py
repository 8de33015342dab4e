"""accel_state.hosts: the one rule for this machine's address and interface toward another."""

from __future__ import annotations

from accel_state import hosts


def test_address_toward_loopback_is_loopback_on_an_interface() -> None:
    assert hosts.address_toward("127.0.0.1") == "127.0.0.1"
    assert hosts.interface_of("127.0.0.1") is not None  # lo, by whatever name
    assert hosts.address_on(hosts.interface_of("127.0.0.1") or "") is not None


def test_address_toward_an_unresolvable_name_is_none() -> None:
    assert hosts.address_toward("no-such-host.invalid") is None
    assert hosts.interface_of("203.0.113.77") is None  # TEST-NET-3: no interface holds it


def test_socket_interface_env_never_overrides_what_is_set() -> None:
    both = hosts.SOCKET_IFNAME_VARIABLES
    assert hosts.socket_interface_env("eth1", {}) == dict.fromkeys(both, "eth1")
    assert hosts.socket_interface_env("eth1", {"GLOO_SOCKET_IFNAME": "eth0"}) == {
        "NCCL_SOCKET_IFNAME": "eth1"
    }
    assert hosts.socket_interface_env(None, {}) == {}
    gloo = (hosts.ENV_GLOO_SOCKET_IFNAME,)
    assert hosts.socket_interface_env("eth1", {}, gloo) == {"GLOO_SOCKET_IFNAME": "eth1"}
