"""accelerate.utils.tqdm's progress bar."""

from __future__ import annotations

from typing import Any


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """tqdm's progress bar, shown only on the local main process when `main_process_only`."""
    from tqdm.auto import tqdm as bar

    if main_process_only:
        from accel_state import PartialState

        kwargs["disable"] = kwargs.get("disable", False) or not PartialState().is_local_main_process
    return bar(*args, **kwargs)
