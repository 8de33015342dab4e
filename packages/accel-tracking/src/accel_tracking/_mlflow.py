"""MLflow, through MLflow's own module functions on the run the tracker starts.

`start()` makes the tracker's run MLflow's active run (``mlflow.start_run``), as accelerate
does, so ``mlflow.log_*`` calls in user code land in the same run; `finish()` ends it. Runs
are stored at MLflow's tracking URI (``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``);
`logging_dir` is where a newly created experiment keeps its artifacts. MLflow 3 refuses a
plain file store unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional
from accel_tracking._values import coerce_step, scalar_values, to_python_tree, warn_once

# The environment variables read when the tracker is made; each wins over its argument.
ENV_EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"  # the experiment's name
ENV_RUN_ID = "MLFLOW_RUN_ID"  # an existing run to continue
ENV_TAGS = "MLFLOW_TAGS"  # the run's tags, as a JSON object
ENV_NESTED_RUN = "MLFLOW_NESTED_RUN"  # a boolean string ("true", "0", "off", ...)

# MLflow's limits, used when `mlflow.utils.validation` does not define them.
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_LENGTH = 6000
_BAD_KEY_CHARS = re.compile(r"[^\w\-. :/]")
_TRUE, _FALSE = {"1", "true", "t", "yes", "y", "on"}, {"0", "false", "f", "no", "n", "off"}


def _env_bool(name: str, default: bool) -> bool:
    """The boolean environment variable `name`, else `default`; any other value is an error."""
    raw = os.environ.get(name)
    if raw is None:
        return bool(default)
    if raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise ValueError(f"{name}={raw!r} is not a boolean; use one of {sorted(_TRUE | _FALSE)}.")


def _tags(tags: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """`tags` (or ``MLFLOW_TAGS``) as a dict; a string must hold a JSON object."""
    tags = os.environ.get(ENV_TAGS, tags)
    if not isinstance(tags, str):
        return None if tags is None else dict(tags)
    try:
        parsed = json.loads(tags)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"MLflow tags {tags!r} are not JSON; give a dict or a JSON object."
        ) from exc
    if not isinstance(parsed, dict):
        raise ValueError(f'MLflow tags {tags!r} are not a JSON object; use \'{{"key": "value"}}\'.')
    return parsed


class MLflowTracker(GeneralTracker):
    """Log to an MLflow run (metrics, params, artifacts, figures) in `experiment_name`.

    Args:
        experiment_name: the experiment, created when missing (``MLFLOW_EXPERIMENT_NAME``
            wins); None uses MLflow's current experiment.
        logging_dir: the artifact location of an experiment this tracker creates.
        run_id: continue this existing run (``MLFLOW_RUN_ID`` wins).
        tags: run tags, a dict or a JSON object string (``MLFLOW_TAGS`` wins); they are also
            the tags of an experiment this tracker creates.
        nested_run: start the run as a child of MLflow's active run (``MLFLOW_NESTED_RUN``, a
            boolean string, wins).
        run_name: the name of a new run.
        description: the run's description (shown in MLflow's description box).
        tracking_uri: accel's addition: when given, `start()` sets it as MLflow's tracking URI
            for the process (``file:...``, ``sqlite:///...``, ``http://...``).
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
        tags: Mapping[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
        tracking_uri: str | None = None,
    ) -> None:
        self._mlflow = import_optional("mlflow", self.extra, self.name)
        self.experiment_name = os.environ.get(ENV_EXPERIMENT_NAME, experiment_name)
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.run_id = os.environ.get(ENV_RUN_ID, run_id)
        self.tags = _tags(tags)
        self.nested_run = _env_bool(ENV_NESTED_RUN, bool(nested_run))
        self.run_name = run_name
        self.description = description
        self.tracking_uri = tracking_uri
        self.active_run: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        """Create (or resume) the run and make it MLflow's active run; a no-op once started."""
        if self.active_run is not None:
            return
        mlflow = self._mlflow
        if self.tracking_uri is not None:
            mlflow.set_tracking_uri(self.tracking_uri)
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=self._experiment_id(),
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )
        self.run_id = self.active_run.info.run_id

    def _experiment_id(self) -> str | None:
        """The id of the experiment named `experiment_name`, created when it does not exist."""
        if self.experiment_name is None:
            return None
        experiment = self._mlflow.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            return experiment.experiment_id
        return self._mlflow.create_experiment(
            self.experiment_name, artifact_location=self.logging_dir, tags=self.tags
        )

    @property
    def tracker(self) -> Any:
        """The `mlflow.ActiveRun` started by `start()` (started on first use)."""
        self.start()
        return self.active_run

    def _key(self, key: str) -> str:
        clean = _BAD_KEY_CHARS.sub("_", key)
        if clean != key:
            warn_once(self._warned, self.name, key, f"has characters MLflow refuses; as {clean!r}")
        return clean

    def _limit(self, name: str, default: int) -> int:
        """One of MLflow's limits (`mlflow.utils.validation`), else accel's copy of it."""
        try:
            validation = importlib.import_module("mlflow.utils.validation")
        except ImportError:
            return default
        return int(getattr(validation, name, default))

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Log `values` as the run's params, each as its string form; `values` is not changed.

        A value longer than MLflow's limit is dropped with a warning. A param already logged
        with another value keeps it, with a warning (MLflow forbids changing a param).
        """
        self.start()
        logged = self._mlflow.get_run(self.run_id).data.params
        params: dict[str, str] = {}
        for key, value in values.items():
            key, text = self._key(str(key)), self._param_text(str(key), value)
            if text is None:
                continue
            if key not in logged:
                params[key] = text
            elif logged[key] != text:
                warnings.warn(
                    f"mlflow tracker: param {key!r} was already logged as {logged[key]!r}; "
                    f"MLflow cannot change it to {text!r}, so it is kept.",
                    stacklevel=2,
                )
        items = list(params.items())
        size = self._limit("MAX_PARAMS_TAGS_PER_BATCH", MAX_PARAMS_PER_BATCH)
        for i in range(0, len(items), size):
            self._mlflow.log_params(dict(items[i : i + size]), run_id=self.run_id)

    def _param_text(self, key: str, value: Any) -> str | None:
        """`value` as MLflow stores it, or None (with a warning) when it is too long."""
        text = str(to_python_tree(value))
        limit = self._limit("MAX_PARAM_VAL_LENGTH", MAX_PARAM_VALUE_LENGTH)
        if len(text) <= limit:
            return text
        what = f"is {len(text)} characters long, over MLflow's {limit}; skipped"
        warn_once(self._warned, self.name, key, what)
        return None

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``mlflow.log_metrics`` of the numbers in `values` at `step` (MLflow's 0 when None).

        Nested dicts become "/" keys; strings and other values are skipped with a warning.
        `kwargs` (``synchronous``, ``timestamp``, ...) go to ``mlflow.log_metrics``.
        """
        self.start()
        metrics = {
            self._key(k): float(v)
            for k, v in scalar_values(values, tracker=self.name, warned=self._warned).items()
        }
        kwargs.setdefault("run_id", self.run_id)
        self._mlflow.log_metrics(metrics, step=coerce_step(step), **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``mlflow.log_image`` per entry (arrays or PIL images), tracked under its key."""
        self.start()
        step = coerce_step(step) or 0
        for key, image in values.items():
            self._mlflow.log_image(image, key=self._key(key), step=step, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **kwargs: Any) -> None:
        """Save a matplotlib or plotly `figure` as the artifact `artifact_file` (e.g. "a.png").

        `kwargs` go to ``mlflow.log_figure`` (``save_kwargs={"dpi": 100}``, ...).
        """
        self.start()
        self._mlflow.log_figure(figure=figure, artifact_file=artifact_file, **kwargs)

    def log_artifact(
        self, local_path: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Copy the file `local_path` into the run's artifacts, under `artifact_path` if given."""
        self.start()
        self._mlflow.log_artifact(
            os.fspath(local_path), artifact_path=artifact_path, run_id=self.run_id
        )

    def log_artifacts(
        self, local_dir: str | os.PathLike[str], artifact_path: str | None = None
    ) -> None:
        """Copy everything in the folder `local_dir` into the run's artifacts."""
        self.start()
        self._mlflow.log_artifacts(
            os.fspath(local_dir), artifact_path=artifact_path, run_id=self.run_id
        )

    def finish(self) -> None:
        """End the run: MLflow's active run when it is this one, else by its id."""
        if self.active_run is None:
            return
        current = self._mlflow.active_run()
        if current is not None and current.info.run_id == self.run_id:
            self._mlflow.end_run()
        else:
            self._mlflow.MlflowClient().set_terminated(self.run_id)
        self.active_run = None
