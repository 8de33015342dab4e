"""Building a torch.profiler from ProfileKwargs."""

from __future__ import annotations

from typing import Any

import torch

from accel._config import ProfileKwargs
from accel_state import device_entry


def make_profiler(handler: ProfileKwargs, device: torch.device) -> Any:
    from torch.profiler import ProfilerActivity, profile, schedule

    names = handler.activities
    if names is None:
        names = ("cpu",) if device_entry(device).is_host else ("cpu", device.type)
    activities = []
    for name in names:
        activity = getattr(ProfilerActivity, name.upper(), None)
        if activity is None:
            accepted = [a.name.lower() for a in ProfilerActivity]
            raise ValueError(f"ProfileKwargs.activities has {name!r}; accepted: {accepted}.")
        activities.append(activity)
    return profile(
        activities=activities,
        schedule=schedule(**handler.schedule_option) if handler.schedule_option else None,
        on_trace_ready=handler.on_trace_ready,
        record_shapes=handler.record_shapes,
        profile_memory=handler.profile_memory,
        with_stack=handler.with_stack,
        with_flops=handler.with_flops,
        with_modules=handler.with_modules,
    )
