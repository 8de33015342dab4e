"""Gradient accumulation: when gradients sync, and which dataloader is being iterated."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class GradientAccumulationPlugin:
    """How gradient accumulation behaves.

    - ``num_steps``: micro-batches per optimizer step.
    - ``adjust_scheduler``: on skipped (non-sync) steps the scheduler's step count still moves,
      so a schedule written in optimizer steps is not stretched.
    - ``sync_with_dataloader``: the last batch of a dataloader always syncs and steps.
    - ``sync_each_batch``: synchronize gradients on every micro-batch (less memory under
      sharded strategies, more communication); the optimizer still steps every num_steps.
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(
                f"gradient accumulation num_steps={self.num_steps!r}: expected an integer >= 1."
            )


class GradientState:
    """Shared by the Accelerator and its wrappers: the sync flag and the active dataloaders.

    It is the `iteration_observer` of every prepared dataloader: a loader calls `begin` when an
    iteration over it starts and `end` when it stops, so nested loops (evaluation inside
    training) know which loader's `end_of_dataloader` and `remainder` apply.
    """

    def __init__(self, plugin: GradientAccumulationPlugin) -> None:
        self.plugin = plugin
        self.sync_gradients = True
        self.step = 0  # micro-steps since the last sync
        self.active_dataloaders: list[Any] = []

    @property
    def num_steps(self) -> int:
        return self.plugin.num_steps

    @property
    def in_dataloader(self) -> bool:
        return bool(self.active_dataloaders)

    @property
    def active_dataloader(self) -> Any:
        return self.active_dataloaders[-1] if self.active_dataloaders else None

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_dataloader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        loader = self.active_dataloader
        return -1 if loader is None else int(loader.remainder)

    # iteration_observer protocol
    def begin(self, loader: Any) -> None:
        self.active_dataloaders.append(loader)

    def end(self, loader: Any) -> None:
        for i in range(len(self.active_dataloaders) - 1, -1, -1):
            if self.active_dataloaders[i] is loader:
                del self.active_dataloaders[i]
                break

    def advance(self) -> None:
        """Called once per micro-batch by `Accelerator.accumulate`: decide whether to sync."""
        plugin = self.plugin
        if plugin.sync_with_dataloader and self.active_dataloaders and self.end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
        else:
            self.step += 1
            self.sync_gradients = self.step % plugin.num_steps == 0
            if self.sync_gradients:
                self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sync_gradients": self.sync_gradients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.sync_gradients = bool(state["sync_gradients"])
