"""Weights & Biases: `wandb.init(project=run_name, **kwargs)`.

Offline runs (``mode="offline"`` in the init kwargs, or ``WANDB_MODE=offline``) write
everything under ``<dir>/wandb/offline-run-*`` for a later `wandb sync`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_tracking._run_tracker import InitRunTracker
from accel_tracking._values import to_python_tree


class WandBTracker(InitRunTracker):
    """Log to a W&B run. `kwargs` are passed to `wandb.init` (entity, tags, dir, mode, ...)."""

    name = "wandb"
    requires_logging_directory = False
    extra = "wandb"
    libraries = ("wandb",)
    module = "wandb"

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.tracker.config.update(to_python_tree(values), allow_val_change=True)
