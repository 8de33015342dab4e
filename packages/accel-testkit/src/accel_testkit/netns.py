"""Separate network hosts on one machine for multi-host tests: Linux network namespaces made
by tools/netns/hosts.sh (each with its own loopback, interfaces, addresses and routes; eth0 a
management network that reaches nobody, eth1 the cluster network on a bridge).

    hosts = make_hosts("accel12", 3)      # or a str: why they cannot be made here
    hosts.command(1, ["accel", "launch", ...])   # the argv that runs on host 1
    hosts.cut(1); hosts.mend(1)           # host 1's cluster link down and up again
    hosts.kill(1)                         # every process on host 1 killed
    hosts.remove()

Hosts that share no filesystem either (`private=True`): each host also has a mount namespace
of its own in which / is read-only and /tmp (and /dev/shm) is a tmpfs only it sees, kept
from one command to the next; its commands run in /tmp/work with HOME, TMPDIR and the
caches in /tmp/home. An object store on the cluster network, in the switch namespace:

    hosts = make_hosts("accel12", 3, private=True)
    hosts.command(1, argv, private=True)  # runs in host 1's own filesystem
    with hosts.store(9000) as s3: ...     # moto at http://10.213.0.2:9000 (accel_testkit.s3)
    hosts.switch_command(argv)            # runs on the switch: the store's network, this
                                          # machine's files (the test process reaches neither
                                          # the hosts nor the store)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel_testkit.s3 import S3Server

__all__ = ["SCRIPT", "STORE_ADDRESS", "Hosts", "hosts_or_skip", "make_hosts"]

# tools/netns/hosts.sh of the workspace (the testkit is installed from the workspace only)
SCRIPT = Path(__file__).resolve().parents[4] / "tools" / "netns" / "hosts.sh"
CLUSTER_NET, DEAD_NET, FIRST_HOST = "10.213.0", "10.214.0", 10
STORE_ADDRESS = f"{CLUSTER_NET}.2"  # the switch's bridge, after `hosts.sh store`


@dataclasses.dataclass(frozen=True)
class Hosts:
    """`count` namespaced hosts named `name`-h0 ...; host i is at 10.213.0.(10+i). With
    `private`, each also has a filesystem of its own (`command(..., private=True)`)."""

    name: str
    count: int
    private: bool = False

    def address(self, i: int) -> str:
        return f"{CLUSTER_NET}.{FIRST_HOST + i}"

    def dead_address(self, i: int) -> str:
        return f"{DEAD_NET}.{FIRST_HOST + i}"

    def command(self, i: int, argv: Sequence[object], private: bool = False) -> list[str]:
        """The argv that runs `argv` on host i; with `private`, in its own filesystem (in
        /tmp/work, HOME=/tmp/home: see tools/netns/hosts.sh), which the hosts must have been
        made with (`make_hosts(..., private=True)`)."""
        if not private:
            return ["ip", "netns", "exec", f"{self.name}-h{i}", *map(str, argv)]
        if not self.private:
            raise ValueError(f"hosts {self.name} were made without private=True")
        return ["bash", str(SCRIPT), "pexec", self.name, str(i), *map(str, argv)]

    def switch_command(self, argv: Sequence[object]) -> list[str]:
        """The argv that runs `argv` in the switch namespace: on the cluster network (where
        the store is) but in this machine's filesystem, as an operator's seat."""
        return ["ip", "netns", "exec", f"{self.name}-sw", *map(str, argv)]

    @contextlib.contextmanager
    def store(self, port: int) -> Iterator[S3Server]:
        """moto's S3 server in the switch namespace at STORE_ADDRESS:`port`, which every host
        reaches over its cluster link (eth1); stopped afterwards. Its `env` is what a host's
        process needs to use it."""
        from accel_testkit.s3 import serve_s3

        self._run("store", self.name)
        with serve_s3(self.switch_command([]), STORE_ADDRESS, port) as s3:
            yield s3

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


def make_hosts(name: str, count: int, *, private: bool = False) -> Hosts | str:
    """Make the hosts (with `private`, each with a filesystem of its own), or return why they
    cannot be made here (not root, no iproute2, no network or mount namespaces)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    if not SCRIPT.is_file():
        return f"{SCRIPT} is missing"
    if private and (shutil.which("unshare") is None or shutil.which("nsenter") is None):
        return "no `unshare` / `nsenter` (install util-linux)"
    hidden = [p for p in (SCRIPT.parents[2], Path(sys.prefix)) if _under_tmp(p)]
    if private and hidden:
        return (
            f"{hidden[0]} is under /tmp, which each host with a filesystem of its own replaces "
            f"with a tmpfs of its own: clone the repository (and keep its .venv) elsewhere"
        )
    steps = [("up", name, str(count)), *([("private", name)] if private else [])]
    for step in steps:
        done = subprocess.run(
            ["bash", str(SCRIPT), *step], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            subprocess.run(["bash", str(SCRIPT), "down", name], capture_output=True, timeout=60)
            what = "network" if step[0] == "up" else "mount"
            return f"{what} namespaces cannot be made here: {done.stderr.strip()[-300:]}"
    return Hosts(name, count, private)


def _under_tmp(path: Path) -> bool:
    return Path("/tmp") in path.resolve().parents


@contextlib.contextmanager
def hosts_or_skip(name: str, count: int, *, private: bool = False) -> Iterator[Hosts]:
    """`count` hosts for a test (a pytest fixture's body), removed afterwards also when the
    test fails; the test skips, saying why, where they cannot be made."""
    made = make_hosts(name, count, private=private)
    if isinstance(made, str):
        import pytest  # the testkit's users are tests

        pytest.skip(made)
    try:
        yield made
    finally:
        made.remove()
