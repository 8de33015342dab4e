"""The peak memory a real training run reaches on the CPU, from torch's profiler.

With `profile_memory=True` every allocation and free of the CPU allocator is a profiler event
carrying the allocator's running total of the bytes allocated while profiling
(`total_allocated`). The count goes on across profiling sessions (a block allocated in one and
freed outside any is never subtracted), so a run counts from the total before its first
event. Profiling starts before the model is built, so the total holds every tensor of the run
(parameters, DDP buckets, shards, optimizer states, activations, the batch); the peak is its
largest value from the first training step on, so building and wrapping do not count.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["measured_peak"]

T = TypeVar("T")


def _walk(nodes: list[Any]) -> list[Any]:
    out = []
    for node in nodes:
        out.append(node)
        out.extend(_walk(node.children))
    return out


def _settle() -> None:
    """Let the collectives of wrapping finish (gloo frees their buffers on its own threads)
    and free what they left, so the steps start from the model as it trains."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    gc.collect()


def measured_peak(build: Callable[[], T], steps: Callable[[T], None]) -> int:
    """Bytes live at the peak of `steps(build())`, counting everything `build` made."""
    from torch.profiler import ProfilerActivity, profile, record_function

    gc.collect()  # what earlier runs left is freed now, before this count starts
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        state = build()
        _settle()
        with record_function("accel_testkit_steps"):
            steps(state)
    events = _walk(prof.profiler.kineto_results.experimental_event_tree())
    start = min(e.start_time_ns for e in events if e.name == "accel_testkit_steps")
    allocs = sorted(
        (e for e in events if str(e.tag).endswith("Allocation")), key=lambda e: e.start_time_ns
    )
    base = allocs[0].typed[1].total_allocated - allocs[0].typed[1].alloc_size
    return max(e.typed[1].total_allocated for e in allocs if e.start_time_ns >= start) - base
