import json
import sys
from unittest import mock

import numpy as np
import pytest

from accel_tracking import MLflowTracker, TrackerValueWarning, resolve_trackers

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path, monkeypatch):
    # MLflow 3 refuses the file store unless told; sqlite would need SQLAlchemy.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no network, no session variable
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    yield uri
    while mlflow.active_run() is not None:  # a failed test must not leave its run active
        mlflow.end_run()
    mlflow.set_tracking_uri(None)  # forget a URI a tracker set; the variable is restored


def _client(store):
    return mlflow.MlflowClient(tracking_uri=store)


def test_metrics_and_params_read_back(store):
    config = {"lr": 0.1, "model": {"layers": [2, 2]}, "name": "tiny", "unset": None}
    init_kwargs = {"mlflow": {"tracking_uri": store, "run_name": "r1", "tags": {"team": "x"}}}
    (tracker,) = resolve_trackers("mlflow", "proj", init_kwargs=init_kwargs, config=config)
    values = {"train": {"loss": np.float64(0.5)}, "note": "text", "bad(key)": 1.0}
    with pytest.warns(TrackerValueWarning) as caught:
        tracker.log(values, step=1)
    assert {str(w.message).split("'")[1] for w in caught} == {"note", "bad(key)"}
    tracker.log({"train": {"loss": 0.25}}, step=2)
    with pytest.warns(UserWarning, match="cannot change it"):
        tracker.store_init_configuration({"lr": 0.2, "extra": 3})
    tracker.finish()
    assert values["train"] == {"loss": np.float64(0.5)}

    client = _client(store)
    (experiment,) = [e for e in client.search_experiments() if e.name == "proj"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == tracker.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "r1" and run.data.tags["team"] == "x"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    assert run.data.metrics["bad_key_"] == 1.0
    # Like accelerate: params are top-level keys, each value as its string form.
    assert run.data.params == {
        "lr": "0.1",
        "model": "{'layers': [2, 2]}",
        "name": "tiny",
        "unset": "None",
        "extra": "3",
    }


def test_resume_a_run_by_id(store):
    first = MLflowTracker("proj", tracking_uri=store)
    first.log({"loss": 1.0}, step=0)
    first.finish()
    again = MLflowTracker("proj", tracking_uri=store, run_id=first.run_id)
    again.log({"loss": 0.5}, step=1)
    again.finish()
    history = _client(store).get_metric_history(first.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.5)]


@pytest.mark.parametrize(("raw", "nested"), [("off", False), ("False", False), ("1", True)])
def test_nested_run_environment_overrides_the_argument(store, monkeypatch, raw, nested):
    monkeypatch.setenv("MLFLOW_NESTED_RUN", raw)
    assert MLflowTracker("proj", tracking_uri=store, nested_run=not nested).nested_run is nested


def test_nested_run_is_a_child_of_the_active_run(store):
    with mlflow.start_run() as parent:
        child = MLflowTracker("proj", nested_run=True)
        child.start()
        assert child.tracker.data.tags["mlflow.parentRunId"] == parent.info.run_id
        child.finish()
        assert mlflow.active_run().info.run_id == parent.info.run_id


def test_environment_wins_over_arguments(store, monkeypatch):
    earlier = MLflowTracker("other")
    earlier.start()
    earlier.finish()
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setenv("MLFLOW_RUN_ID", earlier.run_id)
    monkeypatch.setenv("MLFLOW_TAGS", json.dumps({"source": "env"}))
    tracker = MLflowTracker("proj", run_id="ignored", tags={"source": "arg"})
    assert (tracker.experiment_name, tracker.run_id) == ("from-env", earlier.run_id)
    assert tracker.tags == {"source": "env"}


def test_tags_may_be_a_json_string(store):
    assert MLflowTracker("proj", tags='{"a": 1}').tags == {"a": 1}
    with pytest.raises(ValueError, match="not JSON"):
        MLflowTracker("proj", tags="a=1")


def test_start_makes_the_run_active_and_finish_ends_it(store, tmp_path):
    tracker = MLflowTracker("proj", logging_dir=tmp_path / "artifacts", description="about")
    assert tracker.active_run is None  # nothing happens before start
    tracker.start()
    assert mlflow.active_run().info.run_id == tracker.active_run.info.run_id == tracker.run_id
    tracker.finish()
    assert tracker.active_run is None and mlflow.active_run() is None
    run = mlflow.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.note.content"] == "about"
    experiment = mlflow.get_experiment(run.info.experiment_id)
    assert experiment.artifact_location.endswith("artifacts")  # logging_dir, as in accelerate


def test_log_calls_mlflow_log_metrics_with_step_and_kwargs(store):
    tracker = MLflowTracker("proj")
    tracker.start()
    with mock.patch("mlflow.log_metrics") as log_metrics:
        tracker.log({"loss": 0.1}, step=3, synchronous=True)
        tracker.log({"loss": 0.2})
    first, second = log_metrics.call_args_list
    assert first.args == ({"loss": 0.1},)
    assert first.kwargs == {"step": 3, "synchronous": True, "run_id": tracker.run_id}
    assert second.kwargs["step"] is None  # MLflow records it at step 0
    tracker.log({"loss": 0.3})
    tracker.finish()
    (metric,) = _client(store).get_metric_history(tracker.run_id, "loss")
    assert (metric.step, metric.value) == (0, 0.3)


def test_too_long_params_are_skipped_and_the_input_is_kept(store):
    too_long = "x" * (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH + 1)
    values = {"lr": 0.001, "too_long": too_long}
    tracker = MLflowTracker("proj")
    with pytest.warns(TrackerValueWarning, match="'too_long' is 6001 characters long"):
        tracker.store_init_configuration(values)
    tracker.finish()
    assert values == {"lr": 0.001, "too_long": too_long}
    assert mlflow.get_run(tracker.run_id).data.params == {"lr": "0.001"}


def test_artifacts_and_figures(store, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    tracker = MLflowTracker("proj")
    tracker.log_artifact(tmp_path / "b.txt", artifact_path="files")
    tracker.log_artifacts(folder, artifact_path="dir")
    tracker.log_artifact(str(tmp_path / "b.txt"))
    plt = pytest.importorskip("matplotlib.pyplot")
    figure = plt.figure(figsize=(2, 2))
    tracker.log_figure(figure, artifact_file="plots/fig.png")
    plt.close(figure)
    tracker.finish()

    def listed(path=None):
        found = mlflow.artifacts.list_artifacts(run_id=tracker.run_id, artifact_path=path)
        return sorted(a.path for a in found)

    assert listed() == ["b.txt", "dir", "files", "plots"]
    assert listed("files") == ["files/b.txt"]
    assert listed("dir") == ["dir/a.txt"]
    assert listed("plots") == ["plots/fig.png"]


def test_missing_mlflow_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install accel-tracking\[mlflow\]"):
        MLflowTracker("proj")
