"""One process on one device (CPU, a GPU, or any accelerator): nothing to synchronize."""

from __future__ import annotations

from typing import Any

from torch import nn

from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import Strategy


class SingleDeviceStrategy(Strategy):
    name = "single_device"
    reshardable = True  # one full copy of every state: loads on any number of processes

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return self.move_model(model)

    def memory_engine(self) -> tuple[str, dict[str, Any]]:
        return "ddp", {"activation_checkpointing": False}  # DDP on one process: the plain step


def _build(request: StrategyRequest) -> SingleDeviceStrategy:
    if request.info.num_processes > 1:
        raise ValueError(
            f"strategy 'single_device' cannot run {request.info.num_processes} processes; use "
            f"'ddp'."
        )
    return SingleDeviceStrategy(request.info, clip_norm=request.clip_norm)


register_strategy(
    SingleDeviceStrategy.name,
    _build,
    claims=lambda request: 0 if request.info.num_processes == 1 else None,
)
