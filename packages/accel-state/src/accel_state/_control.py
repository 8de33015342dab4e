"""Process control: barriers, ordered sections, per-process decorators, splitting work."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from accel_state._record import recorded

F = TypeVar("F", bound=Callable[..., Any])


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        recorded("barrier", None, dist.barrier)


def split_range(length: int, num_processes: int, process_index: int) -> tuple[int, int]:
    """[start, end) of the contiguous share of `length` items for one process.

    The first ``length % num_processes`` processes get one more item than the others.
    """
    base, extra = divmod(length, num_processes)
    start = process_index * base + min(process_index, extra)
    return start, start + base + (1 if process_index < extra else 0)


def _split_value(value: Any, num: int, index: int, apply_padding: bool) -> Any:
    if isinstance(value, (list, tuple, torch.Tensor)):
        start, end = split_range(len(value), num, index)
        part = value[start:end]
        if apply_padding and len(value) > 0:
            target = math.ceil(len(value) / num)
            missing = target - len(part)
            if missing > 0:
                last = value[-1:]
                if isinstance(value, torch.Tensor):
                    part = torch.cat([part, last.expand(missing, *value.shape[1:])])
                else:
                    part = part + type(value)(list(last) * missing)
        return part
    if _is_selectable(value):  # a datasets.Dataset: its rows, by index
        start, end = split_range(len(value), num, index)
        rows = list(range(start, end))
        if apply_padding and len(value) > 0:
            rows += [len(value) - 1] * (math.ceil(len(value) / num) - len(rows))
        return value.select(rows)
    return value


def _is_selectable(value: Any) -> bool:
    """A table of rows that takes `select(indices)` (HuggingFace datasets' Dataset)."""
    return callable(getattr(value, "select", None)) and hasattr(value, "__len__")


class ProcessControl:
    """Methods every state object offers; they read the topology through these attributes."""

    process_index: int
    num_processes: int
    local_process_index: int
    is_main_process: bool
    is_local_main_process: bool
    is_last_process: bool

    def wait_for_everyone(self) -> None:
        """A barrier across all processes; returns at once in a one-process run."""
        if self.num_processes > 1:
            _barrier()

    @contextlib.contextmanager
    def _first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first, then on the others (e.g. a download)."""
        return self._first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each node's main process first, then on the others."""
        return self._first(self.is_local_main_process)

    def _only_if(self, predicate: Callable[[Any], bool], function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if predicate(self):
                return function(*args, **kwargs)
            return None

        return wrapper  # type: ignore[return-value]

    def on_main_process(self, function: F) -> F:
        """Decorator: the function runs on the main process only (None elsewhere)."""
        return self._only_if(lambda s: s.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        return self._only_if(lambda s: s.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        return self._only_if(lambda s: s.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run on one process. ``@state.on_process(process_index=1)``."""
        if process_index is None:
            raise ValueError(
                "on_process needs process_index=<rank>, e.g. @on_process(process_index=1)."
            )
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(lambda s: s.process_index == process_index, function)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index=<local rank>.")
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only_if(lambda s: s.local_process_index == local_process_index, function)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of a list, tuple, tensor or dict of those, or
        of a HuggingFace ``datasets.Dataset`` (its rows, by ``select``).

        With ``apply_padding`` every process gets the same length, the last element repeated,
        so the shares can be gathered; drop the extras after gathering.
        """
        num, index = self.num_processes, self.process_index
        if num == 1:
            yield inputs
            return
        if isinstance(inputs, Mapping):
            lengths = {
                len(v) for v in inputs.values() if isinstance(v, (list, tuple, torch.Tensor))
            }
            if len(lengths) > 1:
                raise ValueError(
                    f"split_between_processes needs the dict's lists to have one length; got "
                    f"lengths {sorted(lengths)}."
                )
            yield type(inputs)(
                {k: _split_value(v, num, index, apply_padding) for k, v in inputs.items()}
            )
            return
        if not (isinstance(inputs, (list, tuple, torch.Tensor)) or _is_selectable(inputs)):
            raise TypeError(
                f"split_between_processes takes a list, tuple, tensor or dict of those, or a "
                f"datasets.Dataset; got {type(inputs).__name__}."
            )
        yield _split_value(inputs, num, index, apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print(), on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)
