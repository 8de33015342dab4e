"""The dependency-free default tracker: one JSON line per `log` call.

Layout, under ``<logging_dir>/<run_name>/``:

- ``metrics.jsonl``: one line per call, ``{"step": 3, "time": 1712.5, "values": {"loss": 0.1}}``
  (``time`` is the wall time in seconds since the epoch; nested keys are joined with "/").
- ``config.json``: the hyperparameters given to `store_init_configuration`.

Each line is flushed when written, so a crash loses at most the line being written. Opening
an existing log appends to it; with ``resume_step=N`` the lines with ``step >= N`` (written
after the checkpoint being resumed) are dropped first, so the resumed run does not log those
steps twice. The file is rewritten atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from accel_tracking._base import GeneralTracker
from accel_tracking._values import coerce_step, flatten_dict, json_safe, to_python, warn_once

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _kept_lines(path: Path, resume_step: int | None) -> tuple[list[bytes], int]:
    """The lines to keep and how many were dropped (a torn last line, or steps >= resume)."""
    lines = path.read_bytes().splitlines(keepends=True)
    kept = []
    for number, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            warnings.warn(f"{path}: dropped the unfinished last line {number}.", stacklevel=4)
            continue
        if resume_step is not None:
            try:
                step = json.loads(raw).get("step")
            except ValueError:
                warnings.warn(f"{path}: dropped unreadable line {number}.", stacklevel=4)
                continue
            if isinstance(step, int) and step >= resume_step:
                continue
        kept.append(raw)
    return kept, len(lines) - len(kept)


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class JSONLTracker(GeneralTracker):
    """Log to ``<logging_dir>/<run_name>/metrics.jsonl``; hyperparameters in ``config.json``.

    Args:
        run_name: the project or run name; the directory the files go in.
        logging_dir: the parent directory.
        resume_step: when resuming from a checkpoint taken at this step, drop the logged
            lines with ``step >= resume_step`` before appending.
        overwrite: start a fresh file instead of appending to an existing one.
    """

    name = "jsonl"
    requires_logging_directory = True

    def __init__(
        self,
        run_name: str,
        logging_dir: str | os.PathLike[str],
        *,
        resume_step: int | None = None,
        overwrite: bool = False,
    ) -> None:
        if logging_dir is None:
            raise ValueError(
                "JSONLTracker needs a logging_dir (the folder its files go in); got None."
            )
        self.run_name = run_name
        self.run_dir = Path(logging_dir) / run_name
        self.log_path = self.run_dir / METRICS_FILE
        self.config_path = self.run_dir / CONFIG_FILE
        self.resume_step = coerce_step(resume_step)
        self.overwrite = overwrite
        self._file: IO[str] | None = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._file is not None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.overwrite:
            self.log_path.unlink(missing_ok=True)
        elif self._needs_cleanup():
            kept, dropped = _kept_lines(self.log_path, self.resume_step)
            if dropped:
                _atomic_write(self.log_path, b"".join(kept))
        self._file = self.log_path.open("a", encoding="utf-8", buffering=1)

    def _needs_cleanup(self) -> bool:
        """An existing log must be scanned when resuming, or when its last line is torn."""
        if not self.log_path.exists() or self.log_path.stat().st_size == 0:
            return False
        return self.resume_step is not None or not _ends_with_newline(self.log_path)

    @property
    def tracker(self) -> Path:
        """The path of the JSONL file."""
        return self.log_path

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(json_safe(values), indent=2, sort_keys=True)
        _atomic_write(self.config_path, (text + "\n").encode())

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Append one line. JSON types are kept (None as null); other objects are dropped."""
        if self._file is None:
            self.start()
        clean: dict[str, Any] = {}
        for key, raw in flatten_dict(values).items():
            value = to_python(raw)
            if value is None or isinstance(value, (bool, int, float, str, list)):
                clean[key] = json_safe(value)
            else:
                kind = type(value).__name__
                warn_once(self._warned, self.name, key, f"has type {kind}, not JSON; skipped")
        record = {"step": coerce_step(step), "time": time.time(), "values": clean}
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL log back: one dict per line (``step``, ``time``, ``values``).

    `path` is the ``metrics.jsonl`` file or the run directory holding it. An unfinished last
    line (a crash mid-write) is ignored.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"No JSONL log at {str(path)!r}. Pass the metrics.jsonl file written by "
            f"JSONLTracker, or the run directory that holds it."
        )
    records = []
    for raw in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if raw.endswith("\n") and raw.strip():
            records.append(json.loads(raw))
    return records
