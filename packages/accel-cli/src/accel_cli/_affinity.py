"""`--enable_cpu_affinity`: pin this worker to its share of the cores, then become the program.

Run by torchrun (or mpirun, or directly for one process) as
`python -m accel_cli._affinity {script|module|program} TARGET [ARGS...]`. The cores this
process may use are split evenly between the processes of the machine, in local-rank order;
the shim pins itself with `os.sched_setaffinity` and `exec`s the real program, which keeps
the pinning. Where the OS has no affinity call it runs the program unpinned, with a notice.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

# The local rank and local world size, as torchrun, Open MPI and MPICH/Intel MPI name them.
_LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_LOCAL_WORLD = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def _first_int(environ: Mapping[str, str], names: Sequence[str], default: int) -> int:
    for name in names:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return default


def core_share(cores: Sequence[int], local_rank: int, local_world: int) -> list[int]:
    """The cores of `local_rank` among `local_world` processes: an even, disjoint split
    (with fewer cores than processes, processes share cores round-robin)."""
    cores = sorted(cores)
    per = max(1, len(cores) // max(1, local_world))
    start = (local_rank * per) % len(cores)
    return cores[start : start + per]


def main(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    mode, target, *args = argv
    if hasattr(os, "sched_setaffinity"):
        rank = _first_int(environ, _LOCAL_RANK, 0)
        world = _first_int(environ, _LOCAL_WORLD, 1)
        os.sched_setaffinity(0, core_share(sorted(os.sched_getaffinity(0)), rank, world))
    else:  # pragma: no cover - macOS and Windows
        print("accel: --enable_cpu_affinity: this OS cannot pin processes", file=sys.stderr)
    become(mode, target, args)


def become(mode: str, target: str, args: Sequence[str]) -> None:
    """Replace this process by the program: a script, a module (`-m`) or any program."""
    sys.stdout.flush()
    if mode == "program":
        os.execvp(target, [target, *args])
    python = [sys.executable, "-u"]
    os.execv(sys.executable, [*python, *(["-m", target] if mode == "module" else [target]), *args])


if __name__ == "__main__":
    main(sys.argv[1:])
