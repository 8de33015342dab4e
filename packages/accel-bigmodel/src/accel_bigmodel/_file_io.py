"""The system calls the checkpoint readers share.

File descriptors opened once and shared by threads, positional reads that only fill the page
cache (long requests through a small buffer), and ``madvise`` populate calls that fault a whole
range of fresh memory in at once.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
import threading

MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, in one call
SCRATCH = 2**20  # the buffer a reading thread reads through (`read_range`)
try:
    _IOV_MAX = max(1, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 1024


class Files:
    """File descriptors opened once per path, shared by the reading threads."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            return self._fds[path]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def read_range(fd: int, begin: int, end: int, scratch: memoryview) -> None:
    """Read bytes [begin, end) of `fd` into the page cache (their contents are not kept), in as
    few requests as the range allows: every iovec of a request points at `scratch`, so a 32 MiB
    request costs a 1 MiB buffer, which stays in the CPU's cache while the kernel copies into
    it. Stops quietly at the file's end."""
    size = len(scratch)
    pos = begin
    while pos < end:
        full, tail = divmod(min(end - pos, size * _IOV_MAX), size)
        n = os.preadv(fd, [scratch] * full + ([scratch[:tail]] if tail else []), pos)
        if n <= 0:
            return
        pos += n


def populate(address: int, nbytes: int, advice: int) -> bool:
    """Fault the pages of [address, address + nbytes) in with one ``madvise`` call; False where
    the call is missing or refused (the caller's copy or read then faults them itself).

    POPULATE_WRITE: fresh memory before it is written, not a fault per 4 KiB page inside the
    copy (a quarter less CPU here).
    """
    madvise = _libc_madvise()
    if madvise is None or nbytes <= 0:
        return False
    start = address - address % mmap.PAGESIZE
    size = ctypes.c_size_t(address + nbytes - start)
    return not madvise(ctypes.c_void_p(start), size, advice)


@functools.cache
def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
