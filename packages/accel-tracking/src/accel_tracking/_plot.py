"""Render the scalars of a JSONL log to a PNG, to look at a loss curve without a server.

    from accel_tracking import plot_jsonl
    plot_jsonl("runs/my_project", metrics=["loss", "lr"])   # writes runs/my_project/metrics.png

Needs matplotlib (``pip install accel-tracking[plot]``). The figure is drawn on matplotlib's
Agg canvas directly: pyplot, the global backend and rcParams are left alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accel_tracking._base import import_optional
from accel_tracking._jsonl import METRICS_FILE, read_jsonl


def scalar_series(records: Sequence[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """Per metric, the (steps, values) of its numeric entries, in log order.

    A line logged without a step is placed at its line index.
    """
    series: dict[str, tuple[list[int], list[float]]] = {}
    for index, record in enumerate(records):
        step = record.get("step")
        x = step if isinstance(step, int) else index
        for key, value in record.get("values", {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                steps, values = series.setdefault(key, ([], []))
                steps.append(x)
                values.append(float(value))
    return series


def jsonl_figure(
    log: str | os.PathLike[str],
    metrics: Sequence[str] | None = None,
    *,
    columns: int = 2,
    title: str | None = None,
) -> Any:
    """A matplotlib `Figure` with one subplot per metric (all numeric ones, or `metrics`)."""
    figure_mod = import_optional("matplotlib.figure", "plot", "plot")
    series = scalar_series(read_jsonl(log))
    names = list(series) if metrics is None else list(metrics)
    missing = [n for n in names if n not in series]
    if missing or not names:
        raise ValueError(
            f"No numeric values for {missing or 'any metric'} in {os.fspath(log)!r}. Metrics "
            f"in the log: {sorted(series) or 'none'}."
        )
    columns = max(1, min(columns, len(names)))
    rows = math.ceil(len(names) / columns)
    figure = figure_mod.Figure(figsize=(4.5 * columns, 3.0 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        steps, values = series[name]
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title)
    return figure


def plot_jsonl(
    log: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    metrics: Sequence[str] | None = None,
    columns: int = 2,
    title: str | None = None,
    dpi: int = 100,
) -> Path:
    """Write a PNG of the scalars in a JSONL log and return its path.

    Args:
        log: the ``metrics.jsonl`` file, or the run directory that holds it.
        output: the PNG to write; by default ``metrics.png`` beside the log.
        metrics: the metrics to draw, in order; by default every numeric one.
        columns: subplots per row.
        title: a title over the whole figure.
        dpi: resolution of the PNG.
    """
    log_path = Path(log)
    if output is None:
        folder = log_path if log_path.is_dir() else log_path.parent
        output = folder / Path(METRICS_FILE).with_suffix(".png").name
    figure = jsonl_figure(log, metrics, columns=columns, title=title)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=dpi, format="png")
    return output


# The step metrics an Accelerator logs with log_step_metrics=True (keys prefixed "perf/"),
# in the order they are drawn: throughput, compute, memory, data wait.
STEP_METRICS = (
    "perf/samples_per_sec",
    "perf/tokens_per_sec",
    "perf/tflops_per_sec",
    "perf/mfu",
    "perf/peak_memory_bytes",
    "perf/data_wait_fraction",
)


def plot_step_metrics(
    log: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    columns: int = 2,
    dpi: int = 100,
) -> Path:
    """Write a PNG of the step metrics in a JSONL log (throughput, TFLOP/s, MFU, peak memory
    and data wait over optimizer steps: those the log holds) and return its path; by default
    ``step_metrics.png`` beside the log."""
    log_path = Path(log)
    present = scalar_series(read_jsonl(log))
    metrics = [name for name in STEP_METRICS if name in present]
    if not metrics:
        raise ValueError(
            f"No step metrics in {os.fspath(log)!r} (expected keys such as {STEP_METRICS[0]!r}, "
            f"logged by Accelerator(log_step_metrics=True) to a 'jsonl' tracker)."
        )
    if output is None:
        output = (log_path if log_path.is_dir() else log_path.parent) / "step_metrics.png"
    return plot_jsonl(log, output, metrics=metrics, columns=columns, title="step metrics", dpi=dpi)
