"""Weights & Biases: `wandb.init(project=run_name, **kwargs)`.

Offline runs (``mode="offline"`` in the init kwargs, or ``WANDB_MODE=offline``) write
everything under ``<dir>/wandb/offline-run-*`` for a later `wandb sync`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, scalar_values, to_python_tree


class WandBTracker(GeneralTracker):
    """Log to a W&B run. `kwargs` are passed to `wandb.init` (entity, tags, dir, mode, ...)."""

    name = "wandb"
    requires_logging_directory = False
    extra = "wandb"
    libraries = ("wandb",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self._wandb = import_optional("wandb", self.extra, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._run is None:
            kwargs = {"project": self.run_name, **self.init_kwargs}
            self._run = self._wandb.init(**kwargs)

    @property
    def tracker(self) -> Any:
        """The `wandb.Run`."""
        self.start()
        return self._run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.tracker.config.update(to_python_tree(values), allow_val_change=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        clean = scalar_values(values, tracker=self.name, warned=self._warned, strings=True)
        self.tracker.log(clean, step=coerce_step(step), **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is an image (array, PIL image, path) or an ``(image, caption)`` pair."""
        images = {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, None)
            images[key] = self._wandb.Image(image, caption=caption)
        self.tracker.log(images, step=coerce_step(step), **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        table_kwargs: dict[str, Any] = {}
        if columns is not None:
            table_kwargs["columns"] = list(columns)
        if data is not None:
            table_kwargs["data"] = [list(row) for row in data]
        if dataframe is not None:
            table_kwargs["dataframe"] = dataframe
        table = self._wandb.Table(**table_kwargs)
        self.tracker.log({table_name: table}, step=coerce_step(step), **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
