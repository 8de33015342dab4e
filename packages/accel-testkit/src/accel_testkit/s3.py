"""A real S3 server for tests: moto's, serving HTTP on loopback (or on an address inside a
namespace a test made), talked to by accel's real client (s3fs) through the standard AWS
environment. Nothing in the client is mocked.

    with s3_server() as s3:                 # or the `s3` fixture of a conftest
        s3.bucket("ckpt")                   # a fresh bucket
        env = s3.env                        # AWS_ENDPOINT_URL, keys, region: for subprocesses
        with s3.environment(): ...          # the same, in this process

Needs `moto[server]` (the workspace's dev group); a test skips without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["CREDENTIALS", "S3Server", "s3_server", "serve_s3"]

# Any keys work against moto; these are what the tests' processes present.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "accel-test-key",
    "AWS_SECRET_ACCESS_KEY": "accel-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_AWS = ("AWS_ENDPOINT_URL", *CREDENTIALS, "AWS_PROFILE", "AWS_SESSION_TOKEN")


@dataclasses.dataclass
class S3Server:
    """A running server at `endpoint` (http://host:port); `pid`: its process, when it runs
    in one of its own (`serve_s3`)."""

    endpoint: str
    pid: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment a process needs to use this server (and nothing else)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **CREDENTIALS}

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """This process talks to the server while inside; the AWS variables are restored
        afterwards, and fsspec's cached clients dropped so the next one reads them again."""
        saved = {k: os.environ.get(k) for k in _AWS}
        os.environ.update(self.env)
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            os.environ.pop(key, None)
        _forget_clients()
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _forget_clients()

    def bucket(self, name: str) -> str:
        """Create bucket `name` (emptied when it exists); returns ``s3://name``."""
        with self.environment():
            import s3fs

            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            if fs.exists(name):
                fs.rm(name, recursive=True)
                with contextlib.suppress(FileNotFoundError):
                    fs.rmdir(name)
            fs.mkdir(name)
        return f"s3://{name}"


def _forget_clients() -> None:
    """fsspec caches one client per argument set: one made under other variables would go on
    talking to another endpoint with other keys."""
    with contextlib.suppress(ImportError):
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def s3_server(host: str = "127.0.0.1") -> Iterator[S3Server]:
    """moto's server in this process (a thread), on a free port of `host`."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        import pytest

        pytest.skip("moto[server] is not installed (the workspace's dev group has it)")
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    server.start()
    try:
        address, port = server.get_host_and_port()
        yield S3Server(f"http://{address}:{port}")
    finally:
        server.stop()


@contextlib.contextmanager
def serve_s3(prefix: Sequence[str], host: str, port: int | None = None) -> Iterator[S3Server]:
    """moto's server as a process started by `prefix` (``ip netns exec NS``, say), listening
    on `host`:`port` (a free port of this machine's loopback when None); waits until it
    answers, stops it afterwards."""
    if port is None:  # the testkit requires nothing: no accel_state.testing.free_port here
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    argv = [*prefix, sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
    endpoint = f"http://{host}:{port}"
    # moto logs every request on stderr: into a file, never a pipe that nobody reads
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        try:
            _wait_until_it_answers(server, prefix, endpoint, log)
            yield S3Server(endpoint, server.pid)
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_until_it_answers(
    server: subprocess.Popen, prefix: Sequence[str], endpoint: str, log: Any
) -> None:
    deadline = time.monotonic() + 60
    probe = [*prefix, sys.executable, "-c",
             f"import urllib.request; urllib.request.urlopen({endpoint + '/'!r}, timeout=2)"]  # fmt: skip
    while subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
        if server.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise RuntimeError(f"moto's server did not start on {endpoint}: {log.read()[-500:]!r}")
        time.sleep(0.2)
