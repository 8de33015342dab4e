"""W&B in offline mode: the run is written to a .wandb file, which is read back here.

The .wandb file is a record log (7-byte header, then 32 KiB blocks of records, each with a
7-byte header: crc32, length, type) holding protobuf `Record`s.
"""

import json
import struct
import time

import numpy as np
import pytest

from accel_tracking import TrackerValueWarning, resolve_trackers

pytest.importorskip("wandb")

_BLOCK = 32 * 1024
_FULL, _LAST = 1, 4


def _records(path):
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending, out = 7, b"", []
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _finished_records(path, timeout=60.0):
    """The records once the run's closing "exit" record is on disk.

    wandb-core may still be writing the file for a moment after `finish()` returns.
    """
    deadline = time.monotonic() + timeout
    while True:
        records = _records(path) if path.stat().st_size else []
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.1)


def _key(item):
    return item.key or "/".join(item.nested_key)


def test_offline_run_writes_history_and_config(tmp_path, monkeypatch):
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    # wandb exports WANDB_SERVICE for child processes; have monkeypatch remove it afterwards
    monkeypatch.setenv("WANDB_SERVICE", "unset")
    monkeypatch.delenv("WANDB_SERVICE")
    init_kwargs = {"wandb": {"dir": str(tmp_path), "mode": "offline", "name": "r1"}}
    config = {"lr": np.float32(0.5), "model": {"depth": 2}}
    (tracker,) = resolve_trackers("wandb", "proj", init_kwargs=init_kwargs, config=config)
    with pytest.warns(TrackerValueWarning, match="'skip' is None") as caught:
        for step, loss in enumerate([1.0, 0.5, 0.25]):
            tracker.log({"train": {"loss": np.float64(loss)}, "skip": None}, step=step)
    assert len([w for w in caught if w.category is TrackerValueWarning]) == 1  # once per key
    tracker.log_table("preds", columns=["x", "y"], data=[[1, 2], [3, 4]], step=3)
    run_dir = tracker.tracker.dir
    tracker.finish()

    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert str(path.parent) in run_dir
    records = _finished_records(path)
    history = [
        {_key(i): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(h["_step"], h["train/loss"]) for h in history[:3]] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert not any("skip" in h for h in history)
    (table,) = [h for h in history if "preds/nrows" in h]
    assert (table["_step"], table["preds/nrows"], table["preds/ncols"]) == (3, 2, 2)
    saved = json.loads((path.parent / "files" / table["preds/path"]).read_text())
    assert saved["columns"] == ["x", "y"] and saved["data"] == [[1, 2], [3, 4]]

    stored = {}
    for r in records:
        if r.WhichOneof("record_type") == "config":
            stored.update({_key(i): json.loads(i.value_json) for i in r.config.update})
    assert stored["lr"] == 0.5 and stored["model"] == {"depth": 2}
    assert [r.run.project for r in records if r.WhichOneof("record_type") == "run"] == ["proj"]
