"""`accel lighthouse`: torchft's lighthouse, which forms each step's quorum of replica groups
(accel-parallel[ft]); it prints the address to give every group and serves until stopped."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading

NAME = "lighthouse"
HELP = "Serve the lighthouse of a fault-tolerant run across replica groups (torchft)."


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help=HELP,
        description="Starts torchft's lighthouse and prints one line, `lighthouse at "
        "http://HOST:PORT`: the address every replica group is given (`accel launch "
        "--ft_lighthouse ADDR`, FaultTolerancePlugin(lighthouse=...) or TORCHFT_LIGHTHOUSE). "
        "Serves until SIGINT or SIGTERM.",
    )
    p.add_argument(
        "--min_replicas",
        "--min-replicas",
        type=int,
        required=True,
        metavar="N",
        help="The fewest replica groups a quorum forms with.",
    )
    p.add_argument(
        "--bind",
        default="0.0.0.0:0",
        metavar="HOST:PORT",
        help="Where to listen (default 0.0.0.0:0: every interface, a free port).",
    )
    p.add_argument(
        "--join_timeout_ms",
        "--join-timeout-ms",
        type=int,
        default=1000,
        metavar="MS",
        help="After min_replicas groups asked, how long a quorum waits for more (default "
        "1000; none when every group of the last quorum is back).",
    )
    p.add_argument(
        "--heartbeat_timeout_ms",
        "--heartbeat-timeout-ms",
        type=int,
        default=5000,
        metavar="MS",
        help="A group silent this long is left out of the next quorum (default 5000).",
    )
    return p


def run(args: argparse.Namespace) -> int:
    try:
        from accel_parallel.fault_tolerance import serve_lighthouse
    except ImportError as err:
        raise SystemExit(
            f'accel lighthouse needs accel-parallel[ft] ({err}): pip install "accel-parallel[ft]"'
        ) from err
    try:
        server = serve_lighthouse(
            args.min_replicas,
            args.bind,
            join_timeout_ms=args.join_timeout_ms,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        )
    except (ImportError, ValueError) as err:
        raise SystemExit(f"accel lighthouse: {err}") from None
    except Exception as err:  # the port is taken, the address is not this machine's
        raise SystemExit(f"accel lighthouse: cannot serve on {args.bind}: {err}") from None
    print(f"lighthouse at {_reachable(server.address(), args.bind)}", flush=True)
    heartbeat = args.heartbeat_timeout_ms
    print(
        f"replica groups: --ft_timeout above {heartbeat / 1000:g} s (this heartbeat timeout)"
        + ("" if heartbeat == 5000 else f" and --ft_heartbeat_timeout_ms {heartbeat}"),
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    print("lighthouse stopped", file=sys.stderr)
    return 0


def _reachable(address: str, bind: str) -> str:
    """The address as other machines dial it: torchft's names the host it binds; an
    every-interface bind is named by this machine's host name."""
    host = bind.rpartition(":")[0]
    port = address.rstrip("/").rpartition(":")[2]
    if host in ("0.0.0.0", "[::]", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"
