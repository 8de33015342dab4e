"""Trackio: `trackio.init(project=run_name, **kwargs)`; runs are kept in a local database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, scalar_values, to_python_tree


class TrackioTracker(GeneralTracker):
    """Log to a Trackio run; the step is always passed through to `Run.log`."""

    name = "trackio"
    requires_logging_directory = False
    extra = "trackio"
    libraries = ("trackio",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self._trackio = import_optional("trackio", self.extra, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._run is None:
            self._run = self._trackio.init(**{"project": self.run_name, **self.init_kwargs})

    @property
    def tracker(self) -> Any:
        """The `trackio.Run`."""
        self.start()
        return self._run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        config = getattr(self.tracker, "config", None)
        if config is None:
            config = self._trackio.config
        config.update(to_python_tree(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        clean = scalar_values(values, tracker=self.name, warned=self._warned, strings=True)
        self.tracker.log(clean, step=coerce_step(step), **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is an image or an ``(image, caption)`` pair."""
        images = {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, None)
            images[key] = self._trackio.Image(image, caption=caption)
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
        table = self._trackio.Table(**table_kwargs)
        self.tracker.log({table_name: table}, step=coerce_step(step), **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
