"""Where and how DeepSpeed's compiled CPU ops (CPU Adam, its shared-memory communicator) are
built in the tests.

DeepSpeed builds them with torch's JIT extension loader on first use (a minute or more on a
small machine), so the tests point ``TORCH_EXTENSIONS_DIR`` at one folder per machine and pay
that once. An extension is built against one torch's headers and libraries, so the folder is
one per Python and torch version: environments of two torch versions on one machine (CI's
locked lane and its torch-2.9 lane) would otherwise rebuild it for each other in turn, or one
would load the other's build while it is being rewritten.

torch's loader rebuilds an op whenever its build.ninja changes, and that file names the
environment's paths (torch's headers, DeepSpeed's sources): an environment at a new path (a
fresh clone, a second virtual environment) would compile both ops again. So ``CXX`` is
``bin/_cached_cxx.py``, a compile cache keyed by the preprocessed source and the flags with the
site-packages prefix folded: a new path preprocesses and links (seconds) and compiles nothing
it has compiled before. Every process that may build an op must see the same ``CXX`` (it is in
build.ninja too): the root conftest sets both variables for the whole session
(``extension_env()``). A variable already set wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["CACHED_CXX", "extension_env", "torch_extensions_dir"]

CACHED_CXX = str(Path(__file__).parent / "bin" / "_cached_cxx.py")


def torch_extensions_dir() -> str:
    """``$TORCH_EXTENSIONS_DIR``, or ``~/.cache/torch_extensions/py311_torch2.9.0+cu128``
    (this interpreter's Python and torch versions)."""
    import torch

    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    default = Path.home() / ".cache" / "torch_extensions" / f"{python}_torch{torch.__version__}"
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(default)


def extension_env() -> dict[str, str]:
    """The variables of every process that may build DeepSpeed's CPU ops:
    ``TORCH_EXTENSIONS_DIR`` (``torch_extensions_dir()``) and ``CXX`` (the compile cache, unless
    ``CXX`` is set)."""
    return {
        "TORCH_EXTENSIONS_DIR": torch_extensions_dir(),
        "CXX": os.environ.get("CXX") or CACHED_CXX,
    }
