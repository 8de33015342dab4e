"""`recorded`: run a collective, entered into the hang doctor's ring when one is active.

The ring (`accel_state._ring`) is imported by the hang doctor only; a run without the doctor
never loads it, and each collective pays one dictionary lookup here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_RING_MODULE = "accel_state._ring"


def recorded(op: str, data: Any, call: Callable[[], Any]) -> Any:
    """Run `call()`, entering it into the active ring as `op` when there is one (the same
    frame depth as `_ring.recorded`, so the ring finds the caller at the same place)."""
    ring_module = sys.modules.get(_RING_MODULE)
    ring = None if ring_module is None else ring_module.ACTIVE
    if ring is None:
        return call()
    return ring.run(op, data, call)
