"""accelerate.state's helpers that accel-state does not export: the shared-dict descriptor,
the no-op, and whether the process state exists yet."""

from __future__ import annotations

import threading
from typing import Any


class ThreadLocalSharedDict(threading.local):
    """A dict shared by the objects of one thread (the state classes' shared storage)."""

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value


def do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


def is_initialized() -> bool:
    """True once the process state was made (an Accelerator or PartialState was created)."""
    from accel_state import PartialState

    return PartialState._topology is not None
