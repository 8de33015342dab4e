"""The preflight's interface rule on a CUDA GPU: NCCL, told the interface the preflight picks
(NCCL_SOCKET_IFNAME from the route to the main address), binds that interface and runs.

One NCCL rank in a fresh process with NCCL_DEBUG=INFO: its bootstrap line names the interface
it uses. A wrong or missing interface fails NCCL's init ("no socket interface found"), so the
test also fails when the rule hands NCCL a name that is not this host's.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys

import pytest

from accel_cli._launch_config import LaunchConfig
from accel_cli._network import socket_interface_env
from accel_cli._preflight import run_preflight
from accel_state.hosts import interfaces
from accel_state.testing import free_port

pytestmark = pytest.mark.gpu

_WORKER = """
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
t = torch.full((4,), 3.0, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("SUM", t.sum().item(), flush=True)
dist.destroy_process_group()
"""


def _network_address() -> tuple[str, str]:
    """(interface, IPv4 address) of this host's first interface that is not loopback."""
    for name, addrs in sorted(interfaces().items()):
        for address, _ in addrs:
            if ":" not in address and not ipaddress.ip_address(address).is_loopback:
                return name, address
    pytest.skip("this host has no non-loopback IPv4 interface for NCCL's sockets")


def test_nccl_binds_the_interface_the_preflight_picks(tmp_path) -> None:
    interface, address = _network_address()
    config = LaunchConfig(
        num_processes=1, num_machines=1, main_process_ip=address, main_process_port=free_port()
    )
    outcome = run_preflight(config, {}, timeout=20, say=lambda _: None)
    assert not outcome.fatal, outcome.problems
    assert outcome.interface == interface and outcome.route is not None
    chosen = socket_interface_env(outcome.route, {})
    assert chosen == {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "GLOO_"))}
    env.update(chosen, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", RANK="0", WORLD_SIZE="1")
    env.update(MASTER_ADDR=address, MASTER_PORT=str(free_port()), LOCAL_RANK="0")
    run = subprocess.run(
        [sys.executable, "-c", _WORKER], env=env, capture_output=True, text=True, timeout=120
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "SUM 12.0" in run.stdout, log[-4000:]
    # "Bootstrap : Using eth0:10.0.0.2<0>" (NCCL 2.2x), "Bootstrap: Using ..." (later)
    used = re.findall(r"Bootstrap ?: Using (\[\d+\])?([\w.-]+):", log)
    assert used and {name for _, name in used} == {interface}, log[-4000:]
