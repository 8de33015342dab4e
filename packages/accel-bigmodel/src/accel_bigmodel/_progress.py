"""A one-line progress bar on stderr, shown only on a terminal (or when asked)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts steps and redraws ``desc: 3/8 [#####     ] 1.2s`` in place.

    `enabled=None` shows the bar only when the stream is a terminal; True forces it, False
    hides it.
    """

    def __init__(
        self, total: int, desc: str, enabled: bool | None = None, stream: TextIO | None = None
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled and total > 0
        self.total, self.desc, self.count = total, desc, 0
        self.start = time.perf_counter()
        if self.enabled:
            self._draw()

    def _draw(self) -> None:
        width = 24
        filled = width * self.count // self.total
        elapsed = time.perf_counter() - self.start
        bar = "#" * filled + " " * (width - filled)
        self.stream.write(f"\r{self.desc}: {self.count}/{self.total} [{bar}] {elapsed:.1f}s")
        if self.count == self.total:
            self.stream.write("\n")
        self.stream.flush()

    def update(self, steps: int = 1) -> None:
        """Advance by `steps` and redraw."""
        self.count = min(self.total, self.count + steps)
        if self.enabled:
            self._draw()
