"""One process on one device (CPU, a GPU, or any accelerator): nothing to synchronize."""

from __future__ import annotations

from torch import nn

from accel_parallel._strategy import Strategy


class SingleDeviceStrategy(Strategy):
    name = "single_device"
    reshardable = True  # one full copy of every state: loads on any number of processes

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return self.move_model(model)
