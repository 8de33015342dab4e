"""Trackio: `trackio.init(project=run_name, **kwargs)`; runs are kept in a local database."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_tracking._run_tracker import InitRunTracker
from accel_tracking._values import to_python_tree


class TrackioTracker(InitRunTracker):
    """Log to a Trackio run; the step is always passed through to `Run.log`."""

    name = "trackio"
    requires_logging_directory = False
    extra = "trackio"
    libraries = ("trackio",)
    module = "trackio"

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        config = getattr(self.tracker, "config", None)
        if config is None:
            config = self._lib.config
        config.update(to_python_tree(values))
