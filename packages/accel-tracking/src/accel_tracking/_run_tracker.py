"""The shape W&B, Trackio and SwanLab share: ``lib.init(project=...)`` returns a run that
logs dicts with a step; images and tables are ``lib.Image`` / ``lib.Table`` values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, scalar_values


class InitRunTracker(GeneralTracker):
    """Base of the trackers whose library has ``init(project=run_name, **kwargs)``."""

    module: ClassVar[str] = ""  # the library to import
    has_tables: ClassVar[bool] = True

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self._lib = import_optional(self.module, self.extra or self.name, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._run is None:
            self._run = self._lib.init(**{"project": self.run_name, **self.init_kwargs})

    @property
    def tracker(self) -> Any:
        """The run returned by the library's ``init``."""
        self.start()
        return self._run

    def _log(self, payload: Mapping[str, Any], step: int | None, **kwargs: Any) -> None:
        self.tracker.log(dict(payload), step=coerce_step(step), **kwargs)

    def _scalars(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return dict(scalar_values(values, tracker=self.name, warned=self._warned, strings=True))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._log(self._scalars(values), step, **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is an image (array, PIL image, path) or an ``(image, caption)`` pair."""
        images = {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, None)
            images[key] = self._lib.Image(image, caption=caption)
        self._log(images, step, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.has_tables:
            super().log_table(table_name, columns, data, dataframe, step, **kwargs)
            return
        table_kwargs: dict[str, Any] = {}
        if columns is not None:
            table_kwargs["columns"] = list(columns)
        if data is not None:
            table_kwargs["data"] = [list(row) for row in data]
        if dataframe is not None:
            table_kwargs["dataframe"] = dataframe
        self._log({table_name: self._lib.Table(**table_kwargs)}, step, **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
