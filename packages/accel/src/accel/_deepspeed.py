"""The familiar DeepSpeed helper classes of `accelerate.utils.deepspeed`, over the strategy.

The DeepSpeed strategy of accel-parallel drives the engine; `prepare` returns the usual
`AcceleratedOptimizer` / `AcceleratedScheduler`. These classes keep code that names the
familiar wrappers working: each forwards to the engine the way the prepared objects do.
"""

from __future__ import annotations

from typing import Any

from accel._wrappers import AcceleratedOptimizer, AcceleratedScheduler


class DeepSpeedEngineWrapper:
    """A DeepSpeed engine with the familiar `backward(loss, sync_gradients=...)`: sets the
    accumulation boundary, runs the engine's backward and, on a boundary, its step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """An engine's optimizer whose step and zero_grad the engine does (no-ops here)."""

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        self.optimizer = optimizer
        self.precision = self.gradient_state = self.strategy = None
        self.unscaled = False

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """The engine clears the gradients after its step."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """The engine steps."""

    @property
    def step_was_skipped(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.optimizer, "overflow", False))

    @step_was_skipped.setter
    def step_was_skipped(self, value: bool) -> None:
        pass


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the engine steps in its own step (`step()` here does nothing)."""

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        self.stepped_by_engine = True

    def step(self, *args: Any, **kwargs: Any) -> None:
        """The engine steps the scheduler."""


def get_active_deepspeed_plugin(state: Any) -> Any:
    """The DeepSpeed plugin the next `prepare` uses; an error when the run has none."""
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError(
            "DeepSpeed is not enabled in this run: pass Accelerator(deepspeed_plugin=...) or "
            "launch with `accel launch --use_deepspeed`."
        )
    return plugin
