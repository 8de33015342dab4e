"""The preflight's verdict and the network choices, as pure functions (the launches on
separate network hosts are in integration-tests/test_multihost.py)."""

from __future__ import annotations

import socket

import pytest

from accel_cli._command import with_rendezvous
from accel_cli._launch_config import LaunchConfig
from accel_cli._network import (
    NetworkError,
    Route,
    route_to,
    socket_interface_env,
    user_interface,
)
from accel_cli._preflight import host_facts, preflight_wanted, ranges, run_preflight, verdict
from accel_cli._slurm import SLURM_PORT_BASE, SLURM_PORT_SPAN, slurm_default_port

CONFIG = LaunchConfig(
    num_processes=4, num_machines=2, main_process_ip="10.0.0.1", main_process_port=29500
)


def _facts(rank: int, address: str, **changes: object) -> dict:
    config = LaunchConfig(**{**CONFIG.__dict__, "machine_rank": rank, **changes})
    return host_facts(config, address, "eth1")


def test_verdict_of_hosts_that_agree_is_empty() -> None:
    hosts = [_facts(0, "10.0.0.1"), _facts(1, "10.0.0.2")]
    assert verdict(hosts, CONFIG, strict=False, complete=True, ranked=True) == []


def test_verdict_names_a_rank_claimed_twice_and_the_missing_one() -> None:
    hosts = [_facts(1, "10.0.0.2"), _facts(1, "10.0.0.3")]
    found = verdict(hosts, CONFIG, strict=False, complete=False, ranked=True)
    lines = [p.line() for p in found]
    assert all(p.fatal for p in found)
    assert "machine_rank 1: claimed by 2 hosts" in lines[0] and "at 10.0.0.3" in lines[0]
    assert "machine_rank 0 never arrived" in lines[1]


def test_verdict_tells_two_runs_on_one_port_from_a_rank_given_twice() -> None:
    hosts = [_facts(0, "10.0.0.1"), _facts(1, "10.0.0.2"), _facts(1, "10.0.0.2")]
    (problem,) = verdict(hosts, CONFIG, strict=False, complete=True, ranked=True)
    assert "two runs share main_process_port 29500" in problem.message


def test_verdict_world_is_fatal_training_a_warning_unless_strict() -> None:
    hosts = [_facts(0, "10.0.0.1"), _facts(1, "10.0.0.2", mixed_precision="bf16")]
    (warning,) = verdict(hosts, CONFIG, strict=False, complete=True, ranked=True)
    assert not warning.fatal and "mixed_precision=no" in warning.message
    assert "mixed_precision=bf16" in warning.message
    (error,) = verdict(hosts, CONFIG, strict=True, complete=True, ranked=True)
    assert error.fatal
    hosts = [_facts(0, "10.0.0.1"), _facts(1, "10.0.0.2", num_processes=6)]
    (world,) = verdict(hosts, CONFIG, strict=False, complete=True, ranked=True)
    assert world.fatal and "num_processes=4" in world.message and "num_processes=6" in world.message


def test_preflight_is_on_for_several_machines_unless_turned_off() -> None:
    one = LaunchConfig(num_processes=2)
    assert preflight_wanted(CONFIG, None) and not preflight_wanted(CONFIG, "off")
    assert not preflight_wanted(one, None) and preflight_wanted(one, "on")
    assert preflight_wanted(one, "strict")


def test_an_unrouted_main_address_is_named_before_anything_waits() -> None:
    config = LaunchConfig(
        num_processes=2, num_machines=2, main_process_ip="no-such-host.invalid", main_process_port=1
    )
    outcome = run_preflight(config, {}, timeout=1, say=lambda _: None)
    assert outcome.fatal and "does not resolve" in outcome.problems[0].message


def test_a_named_interface_must_exist() -> None:
    with pytest.raises(NetworkError, match="GLOO_SOCKET_IFNAME=nope0 names no interface"):
        user_interface({"GLOO_SOCKET_IFNAME": "nope0"})
    # NCCL's own list and prefix syntax is passed on unchecked
    assert user_interface({"NCCL_SOCKET_IFNAME": "^docker,lo"}) is None


def test_interface_variables_follow_the_route_and_never_override_the_user() -> None:
    route = Route("10.0.0.1", "eth1", "10.0.0.2")
    assert socket_interface_env(route, {}) == {
        "GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"
    }  # fmt: skip
    assert socket_interface_env(route, {"NCCL_SOCKET_IFNAME": "ib0"}) == {
        "GLOO_SOCKET_IFNAME": "eth1"
    }
    assert socket_interface_env(route_to("127.0.0.1"), {}) == {}  # one machine: left alone


def test_route_to_loopback_is_local() -> None:
    route = route_to("127.0.0.1")
    assert route.loopback and route.local_address == "127.0.0.1"
    assert route.interface is not None  # lo, by whatever name this host gives it
    assert socket.inet_aton(route.local_address)


def test_a_slurm_step_over_nodes_gets_a_port_of_its_own() -> None:
    step = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_NODES": "2",
            "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "node[1-2]"}  # fmt: skip
    port = slurm_default_port(step)
    assert port == SLURM_PORT_BASE + (4242 * 31 + 3) % SLURM_PORT_SPAN
    assert slurm_default_port({**step, "SLURM_STEP_ID": "4"}) != port  # another step
    assert slurm_default_port({**step, "SLURM_STEP_NUM_NODES": "1"}) is None  # one node
    assert slurm_default_port({}) is None
    assert with_rendezvous(CONFIG.__class__(**{**CONFIG.__dict__, "main_process_port": None}),
                           port).main_process_port == port  # fmt: skip
    assert with_rendezvous(CONFIG, port).main_process_port == 29500  # a given port wins


def test_a_verdict_over_thousands_of_hosts_names_a_few_and_counts_the_rest() -> None:
    """Messages name SHOWN hosts per value and ranks as ranges: their size does not grow
    with the number of hosts."""
    config = LaunchConfig(
        num_processes=2048, num_machines=2048, main_process_ip="10.0.0.1", main_process_port=29500
    )
    gone = {5, 6, 7, 8, 9, 100}
    sizes = {"num_processes": 2048, "num_machines": 2048}
    kinds = {p: _facts(0, "", mixed_precision=p, **sizes) for p in ("no", "bf16")}
    hosts = []
    for rank in sorted(set(range(2048)) - gone):
        precision = "bf16" if rank in (10, 11, 12, 13, 14, 15) else "no"
        address = f"10.0.{rank // 256}.{rank % 256}"
        hosts.append({**kinds[precision], "machine_rank": rank, "address": address})
    missing, warning = verdict(hosts, config, strict=False, complete=False, ranked=True)
    assert missing.message.startswith(
        "machine_rank 5-9, 100 never arrived (arrived: host 0 (" + socket.gethostname()
    )
    assert "host 3 (" in missing.message and "and 2038 more)" in missing.message
    assert not warning.fatal and warning.message.count("  |  ") == 1
    assert "host 3 (" in warning.message and "and 2032 more mixed_precision=no" in warning.message
    assert "host 13 (" in warning.message and "and 2 more mixed_precision=bf16" in warning.message
    assert len(missing.message) + len(warning.message) < 1500


def test_ranks_are_written_as_runs() -> None:
    assert ranges([3]) == "3" and ranges([2, 3]) == "2, 3" and ranges([0, 1, 2, 5]) == "0-2, 5"
    assert ranges(range(0, 40, 2)) == "0, 2, 4, 6, 8, 10, 12, 14 and 12 more"
