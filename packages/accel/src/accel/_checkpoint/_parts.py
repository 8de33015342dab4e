"""What the checkpoint's writing and loading functions need of the Checkpointer that calls
them: the run's prepared objects and what the run is made of. `_write` and `_load` are typed
against this protocol, so that they sit below `_checkpointer` and never import it."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Protocol

import torch


class CheckpointParts(Protocol):
    """The Checkpointer as `_write` and `_load` see it."""

    state: Any
    strategy: Any
    precision: Any
    gradient_state: Any
    project_configuration: Any
    models: list[torch.nn.Module]
    optimizers: list[Any]
    schedulers: list[Any]
    dataloaders: list[Any]
    custom_objects: list[Any]
    save_hooks: collections.OrderedDict[int, Callable]

    @property
    def writer(self) -> bool: ...

    def model_of(self, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None: ...
