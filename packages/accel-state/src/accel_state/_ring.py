"""The ring of the collectives accel issued on this process, numbered in the order they ran.

Off by default: `ACTIVE` is None and each collective pays one global lookup. The hang doctor
(`accel_state.hang.HangDoctor`) installs a ring; from then on every collective of `_ops` and
every barrier is entered into it with its sequence number, op, shapes, dtypes and the
caller's file:line (the first frame outside accel and torch), and marked left (or failed)
when it returns. The ring keeps the last `size` entries.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# Frames of these top-level modules are accel's or torch's own; the caller is the first
# frame outside them.
INTERNAL_MODULES = frozenset(
    {
        "accel",
        "accel_state",
        "accel_data",
        "accel_parallel",
        "accel_precision",
        "accel_bigmodel",
        "accel_tracking",
        "accel_cli",
        "torch",
        "contextlib",
        "functools",
        "threading",
    }
)
_MAX_LEAVES = 8  # shapes and dtypes kept per entry


def caller_frame(frame: Any) -> Any:
    """The first frame at or above `frame` whose module is not accel's or torch's."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        if module.partition(".")[0] not in INTERNAL_MODULES:
            return frame
        frame = frame.f_back
    return None


def where(frame: Any) -> tuple[str, int]:
    """(file, line) of `frame`, or ("?", 0) when there is none."""
    if frame is None:
        return "?", 0
    return frame.f_code.co_filename, frame.f_lineno


@dataclasses.dataclass
class CollectiveRecord:
    """One collective as this process issued it."""

    seq: int
    op: str
    shapes: list[list[int]]
    dtypes: list[str]
    file: str
    line: int
    started: float  # time.monotonic() when entered
    state: str = "entered"  # then "left" or "failed"
    error: str | None = None

    @property
    def site(self) -> str:
        """`train.py:88`: the caller's file name and line."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("started")
        return out


def _describe(data: Any) -> tuple[list[list[int]], list[str]]:
    import torch

    shapes: list[list[int]] = []
    dtypes: list[str] = []
    stack = [data]
    while stack and len(shapes) < _MAX_LEAVES:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            shapes.append(list(item.shape))
            dtypes.append(str(item.dtype).removeprefix("torch."))
        elif isinstance(item, (list, tuple)):
            stack[:0] = list(item)
        elif isinstance(item, dict):
            stack[:0] = list(item.values())
    if not shapes and data is not None and not isinstance(data, (list, tuple, dict)):
        dtypes.append(type(data).__name__)
    return shapes, dtypes


class CollectiveRing:
    """The last `size` collectives of this process, each entered and then left or failed.

    `on_error(record, error)`, when set, is called when a collective raises an error of
    torch.distributed (a peer that died, a broken connection) before the error propagates.
    `in_call` is true from the start of a collective until it returned or its error was
    handled; `on_settled()`, when set, is called at that point.
    """

    def __init__(self, size: int = 64) -> None:
        if size < 1:
            raise ValueError(f"ring size={size}: expected at least 1 entry.")
        self.entries: collections.deque[CollectiveRecord] = collections.deque(maxlen=size)
        self.count = 0  # collectives entered so far; the next one is number count + 1
        self.current: CollectiveRecord | None = None
        self.on_error: Callable[[CollectiveRecord, BaseException], None] | None = None
        self.on_settled: Callable[[], None] | None = None
        self._depth = 0  # collectives running through run() (one, unless a call nests)

    @property
    def in_call(self) -> bool:
        return self._depth > 0

    def enter(self, op: str, data: Any = None, frame: Any = None) -> CollectiveRecord:
        """Number and record a collective that starts now, called from `frame`."""
        self.count += 1
        shapes, dtypes = _describe(data)
        file, line = where(caller_frame(frame if frame is not None else sys._getframe(1)))
        record = CollectiveRecord(self.count, op, shapes, dtypes, file, line, time.monotonic())
        self.entries.append(record)
        self.current = record
        return record

    def leave(self, record: CollectiveRecord, error: BaseException | None = None) -> None:
        record.state = "left" if error is None else "failed"
        if error is not None:
            first = (str(error).strip().splitlines() or [""])[0]
            record.error = f"{type(error).__name__}: {first}"[:300]
        if self.current is record:
            self.current = None

    def run(self, op: str, data: Any, call: Callable[[], Any]) -> Any:
        """`call()` recorded as collective `op` over `data`."""
        record = self.enter(op, data, sys._getframe(2))
        self._depth += 1
        try:
            out = call()
        except BaseException as err:
            self.leave(record, err)
            if self.on_error is not None and _is_distributed_error(err):
                self.on_error(record, err)
            raise
        else:
            self.leave(record)
            return out
        finally:
            self._depth -= 1
            if not self._depth and self.on_settled is not None:
                self.on_settled()

    def to_list(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in list(self.entries)]


def _is_distributed_error(err: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return True
    # gloo reports a peer that died as a plain RuntimeError naming itself
    text = str(err).lower()
    return type(err) is RuntimeError and ("gloo" in text or "nccl" in text)


# The ring collectives are entered into; None while the hang doctor is off.
ACTIVE: CollectiveRing | None = None


def recorded(op: str, data: Any, call: Callable[[], Any]) -> Any:
    """Run `call()`, entering it into the active ring as `op` when there is one."""
    ring = ACTIVE
    if ring is None:
        return call()
    return ring.run(op, data, call)
