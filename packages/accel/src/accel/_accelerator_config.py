"""How the Accelerator's constructor reads its arguments: the code's value or `accel launch`'s,
the RNG kinds to synchronize, the dataloader configuration and the accumulation plugin."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from accel._config import StepMetricsKwargs
from accel._gradient_state import GradientAccumulationPlugin
from accel_data import DataLoaderConfiguration
from accel_state import resolved_launch_config


def from_launch(name: str, code_value: Any, default: Any) -> Any:
    """The code's value if given (warning when `accel launch` said otherwise), else the launch's."""
    launched = resolved_launch_config()
    if code_value is None:
        return launched.get(name, default)
    explicit = launched.get("explicit", list(launched))  # what a flag or the file set
    if name in launched and name in explicit and launched[name] != code_value:
        warnings.warn(
            f"The code sets {name}={code_value!r} but `accel launch` was configured with "
            f"{name}={launched[name]!r}; using the code's value.",
            stacklevel=3,
        )
    return code_value


_RNG_TYPES = ("generator", "torch", "cuda", "python", "numpy")


def rng_types(rng_types: Any) -> list[str]:
    """The generators to synchronize from the main process at each epoch start.

    "generator" (the default) is met by the prepared loaders themselves: process 0's sampler
    generator is sent to the others at each epoch start (a seedable sampler needs nothing:
    its order is a function of (seed, epoch)). "torch", "cuda", "python" and
    "numpy" broadcast the main process's global state of that generator when an epoch
    starts (not when a resumed epoch continues, so a resume stays exact)."""
    if rng_types is None:
        return ["generator"]
    names = [str(getattr(t, "value", t)).lower() for t in rng_types]
    bad = [n for n in names if n not in _RNG_TYPES]
    if bad:
        why = (
            " (accel does not synchronize XLA's generator between processes: on XLA, set_seed "
            "seeds it on every process)"
            if "xla" in bad
            else ""
        )
        raise ValueError(f"rng_types {bad} not supported{why}; accepted: {list(_RNG_TYPES)}.")
    return names


def dataloader_config(
    config: DataLoaderConfiguration | None,
    split_batches: bool | None,
    even_batches: bool | None,
    dispatch_batches: bool | None,
    use_seedable_sampler: bool | None,
) -> DataLoaderConfiguration:
    config = config or DataLoaderConfiguration()
    overrides = {
        k: v
        for k, v in {
            "split_batches": split_batches,
            "even_batches": even_batches,
            "dispatch_batches": dispatch_batches,
            "use_seedable_sampler": use_seedable_sampler,
        }.items()
        if v is not None
    }
    return dataclasses.replace(config, **overrides) if overrides else config


def one_of(plugin: Any, plugins: Any, name: str) -> Any:
    """`deepspeed_plugin` and `deepspeed_plugins` are one argument under two names."""
    if plugin is not None and plugins is not None:
        raise ValueError(f"pass {name} or {name}s, not both (they are the same argument).")
    return plugin if plugins is None else plugins


def accumulation_plugin(
    plugin: GradientAccumulationPlugin | None, steps: int | None
) -> GradientAccumulationPlugin:
    if plugin is not None:
        if steps not in (None, 1, plugin.num_steps):
            raise ValueError(
                f"gradient_accumulation_steps={steps} and gradient_accumulation_plugin="
                f"{plugin!r} disagree; pass only the plugin."
            )
        return plugin
    steps = from_launch("gradient_accumulation_steps", steps, 1)
    return GradientAccumulationPlugin(num_steps=int(steps))


def step_metrics_for(
    owner: Any, log_step_metrics: bool | None, options: StepMetricsKwargs | None
) -> Any:
    """The Accelerator's StepMetrics, or None when off. On with `log_step_metrics=True`, a
    StepMetricsKwargs handler, or `accel launch --step_metrics` (the code's value wins)."""
    if log_step_metrics is False and options is not None:
        raise ValueError(
            f"log_step_metrics=False contradicts kwargs_handlers' {options!r}, which turns the "
            f"step metrics on; pass one of them."
        )
    on = from_launch("step_metrics", log_step_metrics, False) or options is not None
    if not on:
        return None
    from accel._step_metrics import StepMetrics  # only a run that measures imports it

    return StepMetrics(owner, options or StepMetricsKwargs())
