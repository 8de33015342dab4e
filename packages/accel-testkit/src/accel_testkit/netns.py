"""Separate network hosts on one machine for multi-host tests: Linux network namespaces made
by tools/netns/hosts.sh (each with its own loopback, interfaces, addresses and routes; eth0 a
management network that reaches nobody, eth1 the cluster network on a bridge).

    hosts = make_hosts("accel12", 3)      # or a str: why they cannot be made here
    hosts.command(1, ["accel", "launch", ...])   # the argv that runs on host 1
    hosts.cut(1); hosts.mend(1)           # host 1's cluster link down and up again
    hosts.kill(1)                         # every process on host 1 killed
    hosts.remove()
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["SCRIPT", "Hosts", "hosts_or_skip", "make_hosts"]

# tools/netns/hosts.sh of the workspace (the testkit is installed from the workspace only)
SCRIPT = Path(__file__).resolve().parents[4] / "tools" / "netns" / "hosts.sh"
CLUSTER_NET, DEAD_NET, FIRST_HOST = "10.213.0", "10.214.0", 10


@dataclasses.dataclass(frozen=True)
class Hosts:
    """`count` namespaced hosts named `name`-h0 ...; host i is at 10.213.0.(10+i)."""

    name: str
    count: int

    def address(self, i: int) -> str:
        return f"{CLUSTER_NET}.{FIRST_HOST + i}"

    def dead_address(self, i: int) -> str:
        return f"{DEAD_NET}.{FIRST_HOST + i}"

    def command(self, i: int, argv: Sequence[object]) -> list[str]:
        return ["ip", "netns", "exec", f"{self.name}-h{i}", *map(str, argv)]

    def _run(self, *args: object) -> None:
        subprocess.run(["bash", str(SCRIPT), *map(str, args)], check=True, timeout=60)

    def cut(self, i: int) -> None:
        self._run("cut", self.name, i)

    def mend(self, i: int) -> None:
        self._run("mend", self.name, i)

    def kill(self, i: int) -> None:
        """SIGKILL every process running on host i."""
        self._run("kill", self.name, i)

    def remove(self) -> None:
        self._run("down", self.name)


def make_hosts(name: str, count: int) -> Hosts | str:
    """Make the hosts, or return why they cannot be made here (not root, no iproute2, no
    network namespaces)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    if not SCRIPT.is_file():
        return f"{SCRIPT} is missing"
    done = subprocess.run(
        ["bash", str(SCRIPT), "up", name, str(count)], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True, timeout=60)
        return f"network namespaces cannot be made here: {done.stderr.strip()[-300:]}"
    return Hosts(name, count)


@contextlib.contextmanager
def hosts_or_skip(name: str, count: int) -> Iterator[Hosts]:
    """`count` hosts for a test (a pytest fixture's body), removed afterwards also when the
    test fails; the test skips, saying why, where they cannot be made."""
    made = make_hosts(name, count)
    if isinstance(made, str):
        import pytest  # the testkit's users are tests

        pytest.skip(made)
    try:
        yield made
    finally:
        made.remove()
