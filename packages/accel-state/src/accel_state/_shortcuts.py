"""Module-level forms of the process-control methods, reading the shared PartialState lazily."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from accel_state._state import PartialState

F = TypeVar("F", bound=Callable[..., Any])


def wait_for_everyone() -> None:
    """A barrier across all processes (creates the PartialState if needed)."""
    PartialState().wait_for_everyone()


def _deferred(method: str, function: F, **options: Any) -> F:
    """Decorate now, decide at call time: decorating at import must not create the state."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = PartialState()
        return getattr(state, method)(function, **options)(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def on_main_process(function: F) -> F:
    return _deferred("on_main_process", function)


def on_local_main_process(function: F) -> F:
    return _deferred("on_local_main_process", function)


def on_last_process(function: F) -> F:
    return _deferred("on_last_process", function)


def on_process(function: F | None = None, *, process_index: int) -> Any:
    if function is None:
        return functools.partial(on_process, process_index=process_index)
    return _deferred("on_process", function, process_index=process_index)
