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


# What one attempt did, ordered so that the worst outcome on any process wins.
_OK, _OOM, _FAILED = 0, 1, 2


def _agreed_outcome(outcome: int) -> int:
    """The worst outcome of this attempt over every process of the default group (this
    process's own when there is no group), so that all retry with the same batch size."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return outcome
    backend = str(dist.get_backend())
    device = torch.device("cpu")
    if backend != "gloo":
        acc = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        if acc is not None:
            device = torch.device(acc.type, torch.get_device_module(acc.type).current_device())
    flag = torch.tensor([outcome], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


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

    With a process group, the processes agree after each attempt (one small all-reduce):
    an OOM on any of them makes all of them retry with the same smaller size, and another
    error on one stops them all, instead of leaving the others waiting in a collective.
    An OOM inside a collective of `function` itself cannot be rescued this way: the other
    processes wait there for the failed one.
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
        if batch_size < 1:
            raise RuntimeError(
                f"No executable batch size found, reached zero: starting_batch_size="
                f"{starting_batch_size}; start from a batch size of 1 or more."
            )
        while True:
            error: BaseException | None = None
            try:
                result = function(batch_size, *args, **kwargs)
            except Exception as err:
                error = err
            outcome = _agreed_outcome(
                _OK if error is None else _OOM if should_reduce_batch_size(error) else _FAILED
            )
            if outcome == _OK:
                return result
            if outcome == _FAILED:
                if error is not None and not should_reduce_batch_size(error):
                    raise error
                raise RuntimeError(
                    f"find_executable_batch_size: another process failed at batch size "
                    f"{batch_size} with an error other than out of memory (see its traceback); "
                    f"stopping here too."
                ) from error
            clear_device_cache(garbage_collection=True)
            smaller = min(batch_size - 1, int(batch_size * reduce_factor))
            if smaller < minimum_batch_size:
                raise RuntimeError(
                    f"No executable batch size found: out of memory at batch size "
                    f"{batch_size}, and the minimum is {minimum_batch_size}."
                ) from error
            where = "" if error is not None else " on another process"
            warnings.warn(
                f"find_executable_batch_size: out of memory{where} at batch size "
                f"{batch_size}; retrying with {smaller}.",
                stacklevel=2,
            )
            batch_size = smaller

    return run
