"""DVCLive: metrics and params in plain files under the `dvclive.Live` directory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, json_safe, scalar_values


class DVCLiveTracker(GeneralTracker):
    """Log to a `dvclive.Live` (made from `kwargs`, or the one passed as `live`).

    Each `log` call is one DVCLive step: the step is set when given, the metrics written, then
    `next_step()` writes the summary (and increments the step for calls without one).
    """

    name = "dvclive"
    requires_logging_directory = False
    extra = "dvclive"
    libraries = ("dvclive",)

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        self._dvclive = import_optional("dvclive", self.extra, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._live: Any = live
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._live is None:
            self._live = self._dvclive.Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The `dvclive.Live`."""
        self.start()
        return self._live

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.tracker.log_params(json_safe(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        step = coerce_step(step)
        live = self.tracker
        if step is not None:
            live.step = step
        for key, value in scalar_values(values, tracker=self.name, warned=self._warned).items():
            live.log_metric(key, value, **kwargs)
        live.next_step()

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """`Live.log_image` per entry; a name without a suffix is saved as ``<name>.png``."""
        for key, image in values.items():
            name = key if "." in key.rsplit("/", 1)[-1] else f"{key}.png"
            self.tracker.log_image(name, image, **kwargs)

    def finish(self) -> None:
        if self._live is not None:
            self._live.end()
            self._live = None
