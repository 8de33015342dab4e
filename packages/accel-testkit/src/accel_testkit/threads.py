"""What another thread of the test's process sees."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["in_thread"]


def in_thread(read: Callable[[], T]) -> T:
    """`read()` called in a new thread of this process; its result (the thread is joined)."""
    got: list[T] = []
    thread = threading.Thread(target=lambda: got.append(read()))
    thread.start()
    thread.join()
    if not got:
        raise RuntimeError(f"{read!r} raised in its thread (its traceback is printed above)")
    return got[0]
