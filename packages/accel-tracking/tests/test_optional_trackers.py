"""Trackers whose libraries are not dependencies of the test environment.

Each test runs the tracker offline against its real library and reads the result back;
it is skipped when the library is not installed.
"""

import pytest

from accel_tracking import resolve_trackers


def test_aim_local_repo(tmp_path):
    aim = pytest.importorskip("aim")
    (tracker,) = resolve_trackers("aim", "proj", logging_dir=tmp_path, config={"lr": 0.1})
    for step, loss in enumerate([1.0, 0.5]):
        tracker.log({"loss": loss}, step=step)
    run_hash = tracker.tracker.hash
    tracker.finish()
    run = aim.Run(run_hash=run_hash, repo=str(tmp_path), read_only=True)
    assert run["hparams"] == {"lr": 0.1}
    (metric,) = [m for m in run.metrics() if m.name == "loss"]
    steps, values = metric.values.sparse_numpy()
    assert list(steps) == [0, 1] and list(values) == [1.0, 0.5]


def test_dvclive_files(tmp_path):
    pytest.importorskip("dvclive")
    kwargs = {"dvclive": {"dir": str(tmp_path / "live"), "save_dvc_exp": False}}
    (tracker,) = resolve_trackers("dvclive", "proj", init_kwargs=kwargs, config={"lr": 0.1})
    for step, loss in enumerate([1.0, 0.5]):
        tracker.log({"train": {"loss": loss}}, step=step)
    tracker.finish()
    rows = (tmp_path / "live" / "plots" / "metrics" / "train" / "loss.tsv").read_text()
    assert [line.split("\t")[-1] for line in rows.split()[1:]] == ["1.0", "0.5"]
    assert "lr: 0.1" in (tmp_path / "live" / "params.yaml").read_text()


def test_comet_offline(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path))
    kwargs = {"comet_ml": {"online": False}}
    (tracker,) = resolve_trackers("comet_ml", "proj", init_kwargs=kwargs, config={"lr": 0.1})
    tracker.log({"loss": 0.5}, step=1)
    tracker.finish()
    assert list(tmp_path.glob("*.zip"))  # the offline experiment archive


def test_clearml_offline(tmp_path, monkeypatch):
    clearml = pytest.importorskip("clearml")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path))
    clearml.Task.set_offline(True)
    try:
        (tracker,) = resolve_trackers("clearml", "proj", config={"lr": 0.1})
        tracker.log({"train/loss": 0.5}, step=1)
        tracker.finish()
    finally:
        clearml.Task.set_offline(False)
    assert list(tmp_path.rglob("*.zip")) or list(tmp_path.rglob("*.json"))


def test_swanlab_local(tmp_path):
    pytest.importorskip("swanlab")
    kwargs = {"swanlab": {"mode": "local", "logdir": str(tmp_path)}}
    (tracker,) = resolve_trackers("swanlab", "proj", init_kwargs=kwargs, config={"lr": 0.1})
    tracker.log({"loss": 0.5}, step=1)
    tracker.finish()
    assert any(tmp_path.rglob("*"))


def test_trackio_local(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))
    (tracker,) = resolve_trackers("trackio", "proj", config={"lr": 0.1})
    for step in (3, 7):
        tracker.log({"loss": step / 10}, step=step)
    tracker.finish()
    assert any(tmp_path.rglob("*.db"))
