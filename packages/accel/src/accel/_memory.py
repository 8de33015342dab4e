"""Out-of-memory retries and freeing memory."""

from __future__ import annotations

import functools
import gc
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

_OOM_MESSAGES = (
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "out of memory",
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether `exception` is an out-of-memory error that a smaller batch could avoid."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    return (
        isinstance(exception, RuntimeError)
        and len(exception.args) == 1
        and any(message in str(exception.args[0]) for message in _OOM_MESSAGES)
    )


def clear_device_cache(garbage_collection: bool = False) -> None:
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop the references passed in and empty the cache: ``a, b = release_memory(a, b)``."""
    objects = list(objects)  # type: ignore[assignment]
    for i in range(len(objects)):
        objects[i] = None  # type: ignore[index]
    clear_device_cache(garbage_collection=True)
    return [None] * len(objects)


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_factor: float = 0.9,
    minimum_batch_size: int = 1,
) -> Any:
    """Decorator: call `function(batch_size, ...)` and retry with a smaller batch on OOM.

    The batch shrinks by `reduce_factor` after each OOM (each retry is reported with a
    warning), down to `minimum_batch_size`, after which the last OOM is raised with a clear
    message. The decorated function takes `batch_size` as its first argument; callers do
    not pass it.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_factor=reduce_factor,
            minimum_batch_size=minimum_batch_size,
        )
    if not 0 < reduce_factor < 1:
        raise ValueError(f"reduce_factor={reduce_factor}: expected a number between 0 and 1.")

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            raise TypeError(
                f"{function.__name__} is called with {len(args)} positional arguments, but the "
                f"batch size is passed as the first one; do not pass it yourself."
            )
        batch_size = starting_batch_size
        while True:
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as err:
                if not should_reduce_batch_size(err):
                    raise
                clear_device_cache(garbage_collection=True)
                smaller = min(batch_size - 1, int(batch_size * reduce_factor))
                if smaller < minimum_batch_size:
                    raise RuntimeError(
                        f"No executable batch size found: out of memory at batch size "
                        f"{batch_size}, and the minimum is {minimum_batch_size}."
                    ) from err
                warnings.warn(
                    f"find_executable_batch_size: out of memory at batch size {batch_size}; "
                    f"retrying with {smaller}.",
                    stacklevel=2,
                )
                batch_size = smaller

    return run
