"""Compile the workspace's own sources before a benchmark spawns its processes.

The workspace packages are installed editable and `uv sync` compiles only the libraries, so
where PYTHONDONTWRITEBYTECODE is set every measured process would compile accel from source
(~0.1 s per `import accel`) while accelerate and torch load their bytecode: an installed accel
(a wheel, compiled at install) does not pay that, and neither should its benchmark.
"""

from __future__ import annotations

import compileall
from pathlib import Path


def compile_workspace() -> None:
    root = Path(__file__).resolve().parents[2]
    compileall.compile_dir(root / "packages", quiet=2)
