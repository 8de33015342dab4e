"""`get_logger`: a logger that logs on the main process unless told otherwise."""

from __future__ import annotations

import logging
import os
from typing import Any

ENV_LOG_LEVEL = "ACCEL_LOG_LEVEL"


class MultiProcessAdapter(logging.LoggerAdapter):
    """``logger.info(msg, main_process_only=True, in_order=False)``: by default only the main
    process logs; ``main_process_only=False`` logs on every process (``in_order`` one after
    the other)."""

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        main_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        from accel_state import PartialState

        state = PartialState()
        if main_only:
            if state.is_main_process:
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
            return
        for rank in range(state.num_processes if in_order else 1):
            if not in_order or rank == state.process_index:
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
            if in_order:
                state.wait_for_everyone()


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for `name` (level from `log_level` or $ACCEL_LOG_LEVEL) aware of processes."""
    logger = logging.getLogger(name)
    level = log_level or os.environ.get(ENV_LOG_LEVEL)
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
