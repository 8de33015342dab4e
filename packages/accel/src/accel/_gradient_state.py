"""Gradient accumulation: when gradients sync, and which dataloader is being iterated."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, ClassVar

from accel_state import declare_shared_state


@dataclasses.dataclass
class GradientAccumulationPlugin:
    """How gradient accumulation behaves (accelerate's fields, in its order; they may be
    assigned after creation, and the running Accelerator reads the new value).

    - ``num_steps``: micro-batches per optimizer step (None, accelerate's default, means 1).
    - ``adjust_scheduler``: on skipped (non-sync) steps the scheduler's step count still moves,
      so a schedule written in optimizer steps is not stretched.
    - ``sync_with_dataloader``: the last batch of a dataloader always syncs and steps.
    - ``sync_each_batch``: synchronize gradients on every micro-batch (less memory under
      sharded strategies, more communication); the optimizer still steps every num_steps.
    """

    num_steps: int | None = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is None:
            self.num_steps = 1
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(
                f"gradient accumulation num_steps={self.num_steps!r}: expected an integer >= 1."
            )


class GradientState:
    """Shared by the Accelerator and its wrappers: the sync flag and the active dataloaders.

    As in accelerate, every instance shares one state, so `GradientState()` anywhere (a
    library, a callback) reads what the running Accelerator decided (`sync_gradients`,
    `end_of_dataloader`, `num_steps`); one per replica thread where torch-xla runs them as
    threads (accel_state.split_state_per_thread). Passing a plugin (the Accelerator does)
    sets the accumulation settings and starts a new count.

    It is the `iteration_observer` of every prepared dataloader: a loader calls `begin` when an
    iteration over it starts and `end` when it stops, so nested loops (evaluation inside
    training) know which loader's `end_of_dataloader` and `remainder` apply.
    """

    _shared_state: ClassVar[dict[str, Any]] = {}

    def __init__(
        self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None
    ) -> None:
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.plugin = GradientAccumulationPlugin()
            self.sync_gradients = True
            self.step = 0  # micro-steps since the last sync
            self.micro_step = 0  # micro-steps since the last end of a dataloader (accelerator.step)
            self.active_dataloaders: list[Any] = []
        if gradient_accumulation_plugin is not None:
            self.plugin = gradient_accumulation_plugin
            self.sync_gradients, self.step, self.micro_step = True, 0, 0
            self.active_dataloaders = []  # a new Accelerator: loaders of an earlier one are done

    @property
    def initialized(self) -> bool:
        return "plugin" in self._shared_state

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The plugin's settings that differ from the defaults, as accelerate reports them
        (`num_steps` always: accelerate's plugin has no default for it)."""
        default = GradientAccumulationPlugin()
        return {
            k: v
            for k, v in dataclasses.asdict(self.plugin).items()
            if k == "num_steps" or v != getattr(default, k)
        }

    adjust_scheduler = property(lambda self: self.plugin.adjust_scheduler)
    sync_with_dataloader = property(lambda self: self.plugin.sync_with_dataloader)
    sync_each_batch = property(lambda self: self.plugin.sync_each_batch)
    dataloader_references = property(lambda self: [None, *self.active_dataloaders])

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = bool(sync_gradients)

    def _add_dataloader(self, dataloader: Any) -> None:
        self.begin(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        self.end(dataloader)

    @property
    def num_steps(self) -> int:
        return self.plugin.num_steps

    @property
    def active_dataloaders(self) -> list[Any]:
        """The loaders being iterated, innermost last. Held by weak reference, so a loader
        whose owner is gone (an iterator left mid-epoch) is collected, not kept alive here."""
        refs = self._shared_state.get("_active_refs", [])
        return [loader for loader in (ref() for ref in refs) if loader is not None]

    @active_dataloaders.setter
    def active_dataloaders(self, loaders: list[Any]) -> None:
        self._active_refs = [weakref.ref(loader) for loader in loaders]

    @property
    def in_dataloader(self) -> bool:
        return bool(self.active_dataloaders)

    @property
    def active_dataloader(self) -> Any:
        """The innermost loader being iterated (read once a step: builds no list)."""
        for ref in reversed(self.__dict__.get("_active_refs", ())):
            loader = ref()
            if loader is not None:
                return loader
        return None

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
        self.active_dataloaders = [*self.active_dataloaders, loader]

    def end(self, loader: Any) -> None:
        loaders = self.active_dataloaders
        for i in range(len(loaders) - 1, -1, -1):
            if loaders[i] is loader:
                del loaders[i]
                self.active_dataloaders = loaders
                break

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "micro_step": self.micro_step,
            "sync_gradients": self.sync_gradients,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.micro_step = int(state.get("micro_step", self.step))
        self.sync_gradients = bool(state["sync_gradients"])


declare_shared_state(GradientState, "_shared_state", dict)
