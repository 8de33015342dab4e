"""Where DeepSpeed's compiled CPU ops (CPU Adam, its shared-memory communicator) are kept.

DeepSpeed builds them with torch's JIT extension loader on first use (a minute or more on a
small machine), so the tests that use them point ``TORCH_EXTENSIONS_DIR`` at one folder per
machine and pay that once. An extension is built against one torch's headers and libraries,
so the folder is one per Python and torch version: environments of two torch versions on one
machine (CI's locked lane and its torch-2.9 lane) would otherwise rebuild it for each other
in turn, or one would load the other's build while it is being rewritten. A
``TORCH_EXTENSIONS_DIR`` already set wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["torch_extensions_dir"]


def torch_extensions_dir() -> str:
    """``$TORCH_EXTENSIONS_DIR``, or ``~/.cache/torch_extensions/py311_torch2.9.0+cu128``
    (this interpreter's Python and torch versions)."""
    import torch

    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    default = Path.home() / ".cache" / "torch_extensions" / f"{python}_torch{torch.__version__}"
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(default)
