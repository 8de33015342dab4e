"""MLflow, through an `MlflowClient` bound to one tracking URI.

The client API is used instead of the global "active run" so that the tracker sets no
process-wide MLflow state. To use MLflow's own functions on the same run, wrap them in
``mlflow.start_run(run_id=tracker.run_id)``.

The tracking URI is `tracking_uri`, else `logging_dir`, else MLflow's default
(``MLFLOW_TRACKING_URI``). MLflow 3 refuses a plain file store unless
``MLFLOW_ALLOW_FILE_STORE=true`` is set; a ``sqlite:///`` URI needs SQLAlchemy installed.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Mapping
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, param_values, scalar_values, warn_once

# MLflow's limits (mlflow.utils.validation); kept here so the tracker does not import internals.
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VALUE_LENGTH = 6000
_BAD_KEY_CHARS = re.compile(r"[^\w\-. :/]")


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class MLflowTracker(GeneralTracker):
    """Log to an MLflow run (metrics, params, tags) in the experiment `experiment_name`.

    Args:
        experiment_name: the experiment (the project name when made by `resolve_trackers`).
        logging_dir: used as the tracking URI when `tracking_uri` is not given.
        run_id: continue this existing run instead of creating one.
        tags: run tags.
        run_name: the run's display name.
        description: the run's description (the ``mlflow.note.content`` tag).
        tracking_uri: where runs are stored (``file:...``, ``sqlite:///...``, ``http://...``).
    """

    name = "mlflow"
    requires_logging_directory = False
    extra = "mlflow"
    libraries = ("mlflow",)

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        run_name: str | None = None,
        description: str | None = None,
        tracking_uri: str | None = None,
    ) -> None:
        self._client_mod = import_optional("mlflow.tracking", self.extra, self.name)
        self._entities = import_optional("mlflow.entities", self.extra, self.name)
        self.experiment_name = experiment_name or "Default"
        self.tracking_uri = tracking_uri or (os.fspath(logging_dir) if logging_dir else None)
        self.run_id = run_id
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        if description is not None:
            self.tags["mlflow.note.content"] = description
        self.run_name = run_name
        self.client: Any = None
        self._run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._run is not None:
            return
        client = self._client_mod.MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id is not None:
            self._run = client.get_run(self.run_id)
            client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                experiment_id = client.create_experiment(self.experiment_name)
            else:
                experiment_id = experiment.experiment_id
            self._run = client.create_run(experiment_id, tags=self.tags, run_name=self.run_name)
            self.run_id = self._run.info.run_id
        self.client = client

    @property
    def tracker(self) -> Any:
        """The `mlflow.entities.Run` as it was when started (query `client` for fresh data)."""
        self.start()
        return self._run

    def _key(self, key: str) -> str:
        clean = _BAD_KEY_CHARS.sub("_", key)
        if clean != key:
            warn_once(self._warned, self.name, key, f"has characters MLflow refuses; as {clean!r}")
        return clean

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Log params. A param already logged with another value keeps it (MLflow forbids change)."""
        self.start()
        logged = self.client.get_run(self.run_id).data.params
        params = []
        for key, value in param_values(values, tracker=self.name, warned=self._warned).items():
            key, text = self._key(key), str(value)
            if len(text) > MAX_PARAM_VALUE_LENGTH:
                warn_once(self._warned, self.name, key, "is too long for MLflow; truncated")
                text = text[:MAX_PARAM_VALUE_LENGTH]
            if key in logged:
                if logged[key] != text:
                    warnings.warn(
                        f"mlflow tracker: param {key!r} was already logged as {logged[key]!r}; "
                        f"MLflow cannot change it to {text!r}, so it is kept.",
                        stacklevel=2,
                    )
                continue
            params.append(self._entities.Param(key, text))
        for chunk in _chunks(params, MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=chunk, synchronous=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log numeric metrics at `step` (0 when None); strings are skipped with a warning."""
        self.start()
        step = coerce_step(step) or 0
        now = int(time.time() * 1000)
        metrics = [
            self._entities.Metric(self._key(k), float(v), now, step)
            for k, v in scalar_values(values, tracker=self.name, warned=self._warned).items()
        ]
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=chunk, **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """`MlflowClient.log_image` per entry (arrays or PIL images), tracked under its key."""
        self.start()
        step = coerce_step(step) or 0
        for key, image in values.items():
            self.client.log_image(self.run_id, image, key=self._key(key), step=step, **kwargs)

    def finish(self) -> None:
        if self._run is not None:
            self.client.set_terminated(self.run_id)
            self._run = None
