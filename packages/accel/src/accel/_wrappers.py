"""The optimizer and scheduler that `prepare` returns: they step only when gradients sync."""

from __future__ import annotations

from typing import Any

import torch

from accel._gradient_state import GradientState


def runs_base(obj: Any, base: type, *methods: str) -> bool:
    """Whether `obj` runs `base`'s own `methods` (its class and the object itself override
    none of them): then a step can skip a layer that would only pass the call on. Asked once,
    when the objects meet (the strategy and precision of a run are chosen once)."""
    own = getattr(obj, "__dict__", {})
    return all(
        getattr(type(obj), name, None) is getattr(base, name) and name not in own
        for name in methods
    )


def plain_backward(strategy: Any, precision: Any) -> bool:
    """Whether the backward is the loss's own: the strategy's default backward (no engine's)
    and a precision without a loss scaler. Decided once, with the strategy and precision."""
    from accel_parallel import Strategy
    from accel_precision import Precision

    return (
        runs_base(strategy, Strategy, "backward")
        and precision.scaler is None
        and runs_base(precision, Precision, "backward")
    )


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer. `step` runs on sync steps only, through the precision
    object (which unscales and skips the step on an fp16 overflow); `zero_grad` likewise."""

    # Whether step / zero_grad may call the optimizer's own directly (see __init__); False, the
    # layered path, for an object unpickled from before these existed.
    _plain_step = False
    _plain_zero_grad = False

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        precision: Any,
        gradient_state: GradientState,
        strategy: Any = None,
    ) -> None:
        # Deliberately not calling Optimizer.__init__: this object forwards to `optimizer`.
        self.optimizer = optimizer
        self.precision = precision
        self.gradient_state = gradient_state
        self.strategy = strategy  # owns step and zero_grad where an engine needs to
        self.step_was_skipped = False
        self.unscaled = False
        self.step_observer: Any = None  # the Accelerator's StepMetrics when on
        # Decided once, not per step: with the strategy's default step (and no clipping) and a
        # precision without a loss scaler, a step is the optimizer's own, and so is zero_grad
        # with the strategy's default one.
        from accel_parallel import Strategy
        from accel_precision import Precision

        default = strategy is None or runs_base(strategy, Strategy, "optimizer_step")
        self._plain_step = (
            default
            and not getattr(strategy, "clip_norm", None)
            and precision.scaler is None
            and runs_base(precision, Precision, "step")
        )
        self._plain_zero_grad = strategy is None or runs_base(strategy, Strategy, "zero_grad")

    @property
    def _is_overflow(self) -> bool:
        """accelerate's name for `step_was_skipped` (scripts and tests set it to mark a step
        the fp16 scaler skipped, which the prepared scheduler then does not count)."""
        return self.step_was_skipped

    @_is_overflow.setter
    def _is_overflow(self, value: bool) -> None:
        self.step_was_skipped = bool(value)

    # Forward the optimizer's own attributes so that schedulers and user code see them.
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            if self._plain_zero_grad:
                self.optimizer.zero_grad(set_to_none=set_to_none)
            else:
                self.strategy.zero_grad(self.optimizer, set_to_none)

    def unscale_gradients(self) -> None:
        """Unscale the fp16 gradients once per step (before clipping)."""
        if not self.unscaled:
            self.precision.unscale_(self.optimizer)
            self.unscaled = True

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return None
        if closure is not None:
            raise ValueError(
                "optimizer.step(closure) is not supported through prepare(); call the closure "
                "yourself (loss = closure()) before optimizer.step()."
            )
        if self._plain_step:  # what the strategy's and the precision's step come down to
            self.optimizer.step()
            stepped = True
        elif self.strategy is None:
            stepped = self.precision.step(self.optimizer)
        else:
            stepped = self.strategy.optimizer_step(self.optimizer, self.precision)
        self.precision.update()
        self.step_was_skipped = not stepped
        self.unscaled = False
        if self.step_observer is not None:
            self.step_observer.optimizer_stepped(self)
        return None

    def train(self) -> None:
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":  # not yet set (unpickling)
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """Wraps an LR scheduler so that it steps with the optimizer.

    On non-sync micro-steps it does not step (with ``adjust_scheduler`` its count still moves);
    when the optimizer skipped its step (fp16 overflow) it does not step either. When it
    steps, it steps `num_processes` times unless batches are split (the familiar behaviour:
    a schedule written for one process lasts as many samples on N processes).
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        gradient_state: GradientState,
        *,
        stepped_by_engine: bool = False,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_processes: int = 1,
    ) -> None:
        self.scheduler = scheduler
        self.stepped_by_engine = stepped_by_engine  # a DeepSpeed engine steps it in its step
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.stepped_by_engine:
            return
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.plugin.adjust_scheduler and hasattr(
                self.scheduler, "_step_count"
            ):
                self.scheduler._step_count += 1
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else self.num_processes
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
