"""SwanLab: `swanlab.init(project=run_name, **kwargs)`.

For a run without a server pass ``mode="local"`` or ``mode="offline"`` (and ``logdir``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, scalar_values, to_python_tree


class SwanLabTracker(GeneralTracker):
    """Log numbers (strings as `swanlab.Text`) and images to a SwanLab experiment."""

    name = "swanlab"
    requires_logging_directory = False
    extra = "swanlab"
    libraries = ("swanlab",)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self._swanlab = import_optional("swanlab", self.extra, self.name)
        self.run_name = run_name
        self.init_kwargs = kwargs
        self._run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._run is None:
            self._run = self._swanlab.init(**{"project": self.run_name, **self.init_kwargs})

    @property
    def tracker(self) -> Any:
        """The run returned by `swanlab.init`."""
        self.start()
        return self._run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.start()
        self._swanlab.config.update(to_python_tree(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.start()
        clean: dict[str, Any] = dict(
            scalar_values(values, tracker=self.name, warned=self._warned, strings=True)
        )
        for key, value in clean.items():
            if isinstance(value, str):
                clean[key] = self._swanlab.Text(value)
        self._swanlab.log(clean, step=coerce_step(step), **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is an image or an ``(image, caption)`` pair."""
        self.start()
        images = {}
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, None)
            images[key] = self._swanlab.Image(image, caption=caption)
        self._swanlab.log(images, step=coerce_step(step), **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self._swanlab.finish()
            self._run = None
