"""Aim: a `aim.Run` in the repository at `logging_dir`, named `run_name`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, json_safe, scalar_values


class AimTracker(GeneralTracker):
    """Track numbers (and strings as `aim.Text`) in an Aim run; `kwargs` go to `aim.Run`."""

    name = "aim"
    requires_logging_directory = True
    extra = "aim"
    libraries = ("aim",)

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] = ".", **kwargs: Any):
        self._aim = import_optional("aim", self.extra, self.name)
        self.run_name = run_name
        self.repo = os.fspath(logging_dir if logging_dir is not None else ".")
        self.init_kwargs = kwargs
        self._run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._run is None:
            self._run = self._aim.Run(repo=self.repo, **self.init_kwargs)
            self._run.name = self.run_name

    @property
    def tracker(self) -> Any:
        """The `aim.Run`."""
        self.start()
        return self._run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.tracker["hparams"] = json_safe(values)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        step = coerce_step(step)
        clean = scalar_values(values, tracker=self.name, warned=self._warned, strings=True)
        for key, value in clean.items():
            if isinstance(value, str):
                value = self._aim.Text(value)
            self.tracker.track(value, name=key, step=step, **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is an image or an ``(image, caption)`` pair."""
        step = coerce_step(step)
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.tracker.track(
                self._aim.Image(image, caption=caption), name=key, step=step, **kwargs
            )

    def finish(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
