"""Choose the strategy once, from the run's configuration."""

from __future__ import annotations

from typing import Any

from accel_parallel._ddp import DDPStrategy, DistributedDataParallelKwargs
from accel_parallel._single import SingleDeviceStrategy
from accel_parallel._strategy import ProcessInfo, Strategy

_KNOWN = ("single_device", "ddp", "fsdp", "deepspeed")


def select_strategy(
    info: ProcessInfo,
    *,
    name: str | None = None,
    ddp_kwargs: DistributedDataParallelKwargs | None = None,
    **options: Any,
) -> Strategy:
    """The strategy for this run: DDP when there are several processes, else single device.

    `name` forces one ("single_device", "ddp"). FSDP2 and DeepSpeed are planned strategies
    of this same interface; asking for them now raises a clear error.
    """
    if options:
        raise TypeError(f"select_strategy got unknown options {sorted(options)}.")
    if name is None:
        name = "ddp" if info.num_processes > 1 else "single_device"
    if name == "single_device":
        if info.num_processes > 1:
            raise ValueError(
                f"strategy 'single_device' cannot run {info.num_processes} processes; use 'ddp'."
            )
        return SingleDeviceStrategy(info)
    if name == "ddp":
        return DDPStrategy(info, ddp_kwargs)
    if name in _KNOWN:
        raise NotImplementedError(
            f"strategy {name!r} is not available in this version of accel-parallel; available: "
            f"'single_device', 'ddp'."
        )
    raise ValueError(f"Unknown strategy {name!r}; expected one of {list(_KNOWN)}.")
