"""Comet: `comet_ml.start(project=run_name, **kwargs)` (or `comet_ml.Experiment` before 3.41).

For a run without a server, pass ``online=False`` (the experiment is written to a local
archive under ``COMET_OFFLINE_DIRECTORY`` for a later upload).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, param_values, scalar_values


class CometMLTracker(GeneralTracker):
    """Log to a Comet experiment: metrics, parameters, others (strings), images, tables."""

    name = "comet_ml"
    requires_logging_directory = False
    extra = "comet"
    libraries = ("comet_ml",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self._comet = import_optional("comet_ml", self.extra, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._experiment: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._experiment is not None:
            return
        if hasattr(self._comet, "start"):
            kwargs = {"project": self.run_name, **self.init_kwargs}
            self._experiment = self._comet.start(**kwargs)
        else:
            kwargs = {"project_name": self.run_name, **self.init_kwargs}
            self._experiment = self._comet.Experiment(**kwargs)

    @property
    def tracker(self) -> Any:
        """The Comet `Experiment`."""
        self.start()
        return self._experiment

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        params = param_values(values, tracker=self.name, warned=self._warned)
        self.tracker.log_parameters(params)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers with `log_metrics`, strings with `log_other`."""
        step = coerce_step(step)
        clean = scalar_values(values, tracker=self.name, warned=self._warned, strings=True)
        metrics = {k: v for k, v in clean.items() if not isinstance(v, str)}
        for key, text in clean.items():
            if isinstance(text, str):
                self.tracker.log_other(key, text)
        if metrics:
            self.tracker.log_metrics(metrics, step=step, **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        step = coerce_step(step)
        for key, image in values.items():
            self.tracker.log_image(image, name=key, step=step, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Written as ``<table_name>.csv`` with `Experiment.log_table`."""
        rows = dataframe if dataframe is not None else [list(r) for r in (data or [])]
        headers = list(columns) if columns is not None else dataframe is not None
        self.tracker.log_table(
            f"{table_name}.csv",
            tabular_data=rows,
            headers=headers,
            step=coerce_step(step),
            **kwargs,
        )

    def finish(self) -> None:
        if self._experiment is not None:
            self._experiment.end()
            self._experiment = None
