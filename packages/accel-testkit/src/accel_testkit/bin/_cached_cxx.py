#!/usr/bin/env python3
"""A compile cache for torch's JIT extension builds (DeepSpeed's CPU ops in the tests), keyed by
what is compiled, not by where: `CXX=.../_cached_cxx.py` (accel_testkit.extensions).

torch's loader writes a build.ninja naming the environment's paths (torch's headers, DeepSpeed's
sources), so an environment at a new path (a fresh clone, CI's second lane) compiles the same op
again: a minute or more for each. Here a compile (`-c SRC -o OBJ`) first runs the preprocessor
alone (which also writes ninja's depfile for this environment's paths), hashes its output and
the flags with every `.../site-packages/` prefix folded, and copies the object kept under that
key (`$ACCEL_CXX_CACHE`, else ~/.cache/accel-cxx) when there is one; else it compiles and keeps
the object. The key covers the compiler (`-dumpfullversion -dumpmachine`), the flags and every
header's contents, so torch's, Python's and DeepSpeed's versions are in it. Linking and anything
else go straight to the compiler (`$ACCEL_REAL_CXX`, else c++). Only the standard library: it
runs under whatever python3 is on PATH. The key also holds the build folder where the flags
have -g (DeepSpeed's CPU Adam: the preprocessor then names the working directory), so a hit
needs the same TORCH_EXTENSIONS_DIR, which torch_extensions_dir() keeps per Python and torch
version whatever the environment's path.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REAL = os.environ.get("ACCEL_REAL_CXX") or "c++"
_SITE = re.compile(rb"[^\s\"'<>=]*/site-packages/")


def _fold(text: bytes) -> bytes:
    return _SITE.sub(b"<site-packages>/", text)


def main(args: list[str]) -> int:
    if "-c" not in args or "-o" not in args or "-E" in args:
        os.execvp(REAL, [REAL, *args])
    out = args[args.index("-o") + 1]
    cache = Path(os.environ.get("ACCEL_CXX_CACHE") or Path.home() / ".cache" / "accel-cxx")
    with tempfile.TemporaryDirectory(prefix="accel-cxx-") as tmp:
        pre = list(args)
        pre[pre.index("-c")] = "-E"
        pre[pre.index("-o") + 1] = os.path.join(tmp, "pre.ii")
        pre += ["-MT", out]
        done = subprocess.run([REAL, *pre], capture_output=True)
        if done.returncode != 0:  # the compile itself reports it
            return subprocess.run([REAL, *args]).returncode
        key = hashlib.sha256()
        ident = subprocess.run([REAL, "-dumpfullversion", "-dumpmachine"], capture_output=True)
        key.update(ident.stdout)
        skip = {args.index("-o") + 1, args.index("-c") + 1}
        if "-MF" in args:
            skip.add(args.index("-MF") + 1)
        for i, arg in enumerate(args):
            key.update(b"\0" + (b"<path>" if i in skip else _fold(arg.encode())))
        key.update(b"\0" + _fold(Path(tmp, "pre.ii").read_bytes()))
    kept = cache / key.hexdigest()[:2] / (key.hexdigest() + ".o")
    if kept.is_file():
        _copy(kept, Path(out))
        return 0
    rc = subprocess.run([REAL, *args]).returncode
    if rc == 0:
        kept.parent.mkdir(parents=True, exist_ok=True)
        _copy(Path(out), kept)
    return rc


def _copy(src: Path, dst: Path) -> None:
    """Write through a temporary file and rename: a reader never sees half an object."""
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=dst.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(src.read_bytes())
    os.replace(tmp, dst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
