"""accelerate.local_sgd's LocalSGD: parameters averaged across processes every few steps."""

from __future__ import annotations

from typing import Any

import torch


class LocalSGD:
    """Inside the block, each process steps alone; every `local_sgd_steps` calls of `step()`
    the model parameters are averaged across processes (and once more on exit)."""

    def __init__(
        self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.num_processes > 1
        self.num_steps = 0

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._sync()
            self._no_sync.__exit__(*exc)

    def step(self) -> None:
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync()

    def _sync(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.accelerator.unwrap_model(self.model).parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
