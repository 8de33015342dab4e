import numpy as np
import pytest

from accel_tracking import MLflowTracker, TrackerValueWarning, resolve_trackers

pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path, monkeypatch):
    # MLflow 3 refuses the file store unless told; sqlite would need SQLAlchemy.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no network, no session variable
    return (tmp_path / "mlruns").as_uri()


def test_metrics_and_params_read_back(store):
    from mlflow.tracking import MlflowClient

    config = {"lr": 0.1, "model": {"layers": [2, 2]}, "name": "tiny", "unset": None}
    init_kwargs = {"mlflow": {"tracking_uri": store, "run_name": "r1", "tags": {"team": "x"}}}
    with pytest.warns(TrackerValueWarning, match="'unset' is None"):
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

    client = MlflowClient(tracking_uri=store)
    (experiment,) = [e for e in client.search_experiments() if e.name == "proj"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == tracker.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == "r1" and run.data.tags["team"] == "x"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    assert run.data.metrics["bad_key_"] == 1.0
    assert run.data.params == {
        "lr": "0.1",
        "model/layers": "[2, 2]",
        "name": "tiny",
        "extra": "3",
    }


def test_resume_a_run_by_id(store):
    first = MLflowTracker("proj", tracking_uri=store)
    first.log({"loss": 1.0}, step=0)
    first.finish()
    again = MLflowTracker("proj", tracking_uri=store, run_id=first.run_id)
    again.log({"loss": 0.5}, step=1)
    again.finish()
    history = again.client.get_metric_history(first.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 1.0), (1, 0.5)]
