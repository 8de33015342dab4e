import json
import time

import numpy as np
import pytest

from accel_tracking import JSONLTracker, TrackerValueWarning, read_jsonl


def _steps(path):
    return [r["step"] for r in read_jsonl(path)]


def test_lines_config_and_values_read_back(tmp_path):
    tracker = JSONLTracker("proj", tmp_path)
    tracker.start()
    config = {"lr": np.float32(0.5), "model": {"layers": 2}, "tags": ("a", "b")}
    tracker.store_init_configuration(config)
    before = time.time()
    values = {"loss": np.float64(1.5), "eval": {"acc": 0.25}, "note": "warmup", "none": None}
    tracker.log(values, step=1)
    tracker.log({"loss": 0.5}, step=2)
    tracker.finish()

    assert values["eval"] == {"acc": 0.25}  # the caller's dict is untouched
    records = read_jsonl(tmp_path / "proj")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["values"] == {"loss": 1.5, "eval/acc": 0.25, "note": "warmup", "none": None}
    assert records[1]["values"] == {"loss": 0.5}
    assert before - 1 <= records[0]["time"] <= records[1]["time"] <= time.time() + 1
    assert json.loads((tmp_path / "proj" / "config.json").read_text()) == {
        "lr": 0.5,
        "model": {"layers": 2},
        "tags": ["a", "b"],
    }
    assert tracker.tracker == tmp_path / "proj" / "metrics.jsonl"


def test_each_line_is_on_disk_before_finish(tmp_path):
    tracker = JSONLTracker("p", tmp_path)
    tracker.log({"x": 1}, step=0)  # starts itself
    assert _steps(tmp_path / "p") == [0]
    tracker.finish()


def test_objects_json_cannot_hold_are_skipped_with_a_warning(tmp_path):
    tracker = JSONLTracker("p", tmp_path)
    with pytest.warns(TrackerValueWarning, match="'obj' has type object"):
        tracker.log({"obj": object(), "ok": 1}, step=0)
    tracker.finish()
    assert read_jsonl(tmp_path / "p")[0]["values"] == {"ok": 1}


def test_reopen_appends(tmp_path):
    for steps in ([0, 1], [2, 3]):
        tracker = JSONLTracker("p", tmp_path)
        for s in steps:
            tracker.log({"loss": float(s)}, step=s)
        tracker.finish()
    assert _steps(tmp_path / "p") == [0, 1, 2, 3]
    tracker = JSONLTracker("p", tmp_path, overwrite=True)
    tracker.log({"loss": 9.0}, step=9)
    tracker.finish()
    assert _steps(tmp_path / "p") == [9]


def test_resume_drops_steps_logged_after_the_checkpoint(tmp_path):
    first = JSONLTracker("p", tmp_path)
    for s in range(6):
        first.log({"loss": float(s)}, step=s)
    first.log({"epoch_note": "no step"})
    first.finish()

    # the checkpoint was saved at step 4: steps 4 and 5 will be logged again
    resumed = JSONLTracker("p", tmp_path, resume_step=4)
    resumed.start()
    assert _steps(tmp_path / "p") == [0, 1, 2, 3, None]
    for s in range(4, 7):
        resumed.log({"loss": float(s)}, step=s)
    resumed.finish()
    assert _steps(tmp_path / "p") == [0, 1, 2, 3, None, 4, 5, 6]
    assert not [f for f in (tmp_path / "p").iterdir() if f.name.endswith(".tmp")]


def test_torn_last_line_is_dropped_on_open(tmp_path):
    tracker = JSONLTracker("p", tmp_path)
    tracker.log({"loss": 1.0}, step=0)
    tracker.finish()
    log = tmp_path / "p" / "metrics.jsonl"
    with log.open("a") as f:
        f.write('{"step": 1, "time": 1.0, "val')  # a crash mid-write
    assert _steps(log) == [0]  # the reader ignores it
    with pytest.warns(UserWarning, match="unfinished last line"):
        tracker = JSONLTracker("p", tmp_path)
        tracker.start()
    tracker.log({"loss": 0.5}, step=1)
    tracker.finish()
    assert _steps(log) == [0, 1]


def test_missing_log_and_missing_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_jsonl(tmp_path / "nothing")
    with pytest.raises(ValueError, match="needs a logging_dir"):
        JSONLTracker("p", None)
