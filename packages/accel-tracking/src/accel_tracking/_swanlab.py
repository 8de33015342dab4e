"""SwanLab: `swanlab.init(project=run_name, **kwargs)`.

For a run without a server pass ``mode="local"`` or ``mode="offline"`` (and ``logdir``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_tracking._run_tracker import InitRunTracker
from accel_tracking._values import coerce_step, to_python_tree


class SwanLabTracker(InitRunTracker):
    """Log numbers (strings as `swanlab.Text`) and images to a SwanLab experiment."""

    name = "swanlab"
    requires_logging_directory = False
    extra = "swanlab"
    libraries = ("swanlab",)
    module = "swanlab"
    has_tables = False

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.start()
        self._lib.config.update(to_python_tree(values))

    def _log(self, payload: Mapping[str, Any], step: int | None, **kwargs: Any) -> None:
        self.start()  # swanlab logs through the module, to the current run
        self._lib.log(dict(payload), step=coerce_step(step), **kwargs)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        clean = self._scalars(values)
        for key, value in clean.items():
            if isinstance(value, str):
                clean[key] = self._lib.Text(value)
        self._log(clean, step, **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self._lib.finish()
            self._run = None
