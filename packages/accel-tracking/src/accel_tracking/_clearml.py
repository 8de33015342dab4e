"""ClearML: a `clearml.Task` in project `run_name` (or the task already running under an agent).

Keys are split at their last "/" into ClearML's (title, series): ``"train/loss"`` is the
series ``loss`` of the plot ``train``. Without a server, call ``clearml.Task.set_offline(True)``
first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, json_safe, scalar_values


def _title_series(key: str) -> tuple[str, str]:
    title, _, series = key.rpartition("/")
    return (title, series) if title else (key, key)


class ClearMLTracker(GeneralTracker):
    """Report scalars, text, images and tables to a ClearML task; `kwargs` go to `Task.init`."""

    name = "clearml"
    requires_logging_directory = False
    extra = "clearml"
    libraries = ("clearml",)

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        self._clearml = import_optional("clearml", self.extra, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._task: Any = None
        self._owns_task = False
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._task is not None:
            return
        current = self._clearml.Task.current_task()
        if current is not None:
            self._task = current
            return
        kwargs = {"project_name": self.run_name, "task_name": self.run_name, **self.init_kwargs}
        self._task = self._clearml.Task.init(**kwargs)
        self._owns_task = True

    @property
    def tracker(self) -> Any:
        """The `clearml.Task`."""
        self.start()
        return self._task

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.tracker.connect_configuration(json_safe(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Scalars per (title, series); with step None, as single values. Strings as text."""
        step = coerce_step(step)
        logger = self.tracker.get_logger()
        clean = scalar_values(values, tracker=self.name, warned=self._warned, strings=True)
        for key, value in clean.items():
            if isinstance(value, str):
                logger.report_text(f"{key}: {value}")
            elif step is None:
                logger.report_single_value(name=key, value=value)
            else:
                title, series = _title_series(key)
                logger.report_scalar(
                    title=title, series=series, value=value, iteration=step, **kwargs
                )

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        step = coerce_step(step)
        logger = self.tracker.get_logger()
        for key, image in values.items():
            title, series = _title_series(key)
            logger.report_image(
                title=title, series=series, iteration=step or 0, image=image, **kwargs
            )

    def log_table(
        self,
        table_name: str,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """`report_table` with the dataframe, or with the header row followed by the rows."""
        if dataframe is None:
            header = [list(columns)] if columns is not None else []
            table = header + [list(row) for row in (data or [])]
        else:
            table = dataframe
        title, series = _title_series(table_name)
        self.tracker.get_logger().report_table(
            title=title, series=series, iteration=coerce_step(step) or 0, table_plot=table, **kwargs
        )

    def finish(self) -> None:
        if self._task is not None and self._owns_task:
            self._task.close()
        self._task = None
