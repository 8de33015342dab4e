"""accelerate.optimizer's module-level helpers (the optimizer itself is accel's
AcceleratedOptimizer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def move_to_device(state: Any, device: torch.device | str) -> Any:
    """`state` (an optimizer state, nested) with every tensor moved to `device`."""
    from accel_state import send_to_device

    return send_to_device(state, device)


def patch_optimizer_step(
    accelerated_optimizer: Any, method: Callable[..., Any]
) -> Callable[..., Any]:
    """`method` wrapped so that calling it marks the optimizer as having stepped."""

    def patched(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched
