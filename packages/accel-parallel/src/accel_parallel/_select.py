"""Choose the strategy once, from the run's configuration: the one place that decides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_parallel._ddp import DDPStrategy, DistributedDataParallelKwargs
from accel_parallel._single import SingleDeviceStrategy
from accel_parallel._strategy import ProcessInfo, Strategy

_KNOWN = ("single_device", "ddp", "fsdp", "deepspeed")
_LAUNCH_TYPES = {"FSDP": "fsdp", "DEEPSPEED": "deepspeed"}


def select_strategy(
    info: ProcessInfo,
    *,
    name: str | None = None,
    ddp_kwargs: DistributedDataParallelKwargs | None = None,
    fsdp_plugin: Any = None,
    deepspeed_plugin: Any = None,
    launch_config: Mapping[str, Any] | None = None,
    mixed_precision: str = "no",
    **options: Any,
) -> Strategy:
    """The strategy for this run.

    Strongest first: `name`; a plugin (`fsdp_plugin` -> FSDP2, `deepspeed_plugin` ->
    DeepSpeed); the `accel launch` configuration (`distributed_type: FSDP` with its
    `fsdp_config` section); else DDP with several processes and a single device with one.
    `mixed_precision` is the run's mode (FSDP2 derives its parameter dtype from it).
    """
    if options:
        raise TypeError(f"select_strategy got unknown options {sorted(options)}.")
    launch = dict(launch_config or {})
    launched = _LAUNCH_TYPES.get(str(launch.get("distributed_type", "")).upper())
    if name is None:
        if fsdp_plugin is not None and deepspeed_plugin is not None:
            raise ValueError("Pass fsdp_plugin or deepspeed_plugin, not both.")
        if fsdp_plugin is not None:
            name = "fsdp"
        elif deepspeed_plugin is not None:
            name = "deepspeed"
        else:
            name = launched or ("ddp" if info.num_processes > 1 else "single_device")
    if name == "single_device":
        if info.num_processes > 1:
            raise ValueError(
                f"strategy 'single_device' cannot run {info.num_processes} processes; use 'ddp'."
            )
        return SingleDeviceStrategy(info)
    if name == "ddp":
        return DDPStrategy(info, ddp_kwargs)
    if name == "fsdp":
        from accel_parallel._fsdp import FSDP2Strategy
        from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin

        if fsdp_plugin is None:
            fsdp_plugin = FullyShardedDataParallelPlugin.from_launch_config(
                launch.get("fsdp_config") or {}
            )
        return FSDP2Strategy(info, fsdp_plugin, mixed_precision=mixed_precision)
    if name in _KNOWN:
        raise NotImplementedError(
            f"strategy {name!r} is not available in this version of accel-parallel; available: "
            f"'single_device', 'ddp', 'fsdp'."
        )
    raise ValueError(f"Unknown strategy {name!r}; expected one of {list(_KNOWN)}.")
