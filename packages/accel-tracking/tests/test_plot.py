import pytest

from accel_tracking import JSONLTracker, jsonl_figure, plot_jsonl, read_jsonl, scalar_series

pytest.importorskip("matplotlib")


def _write_log(tmp_path):
    tracker = JSONLTracker("run", tmp_path)
    for step in range(20):
        tracker.log({"loss": 10.0 - step * 0.5, "lr": 0.1, "phase": "train"}, step=step)
    tracker.finish()
    return tmp_path / "run"


def test_figure_holds_the_logged_curve(tmp_path):
    run = _write_log(tmp_path)
    steps, losses = scalar_series(read_jsonl(run))["loss"]
    figure = jsonl_figure(run, ["loss"])
    ((line,),) = [ax.get_lines() for ax in figure.axes if ax.get_visible()]
    assert list(line.get_xdata()) == steps == list(range(20))
    assert list(line.get_ydata()) == losses == [10.0 - s * 0.5 for s in range(20)]
    all_metrics = jsonl_figure(run)
    assert [ax.get_title() for ax in all_metrics.axes if ax.get_visible()] == ["loss", "lr"]


def test_png_shows_a_falling_curve(tmp_path):
    from matplotlib import colors, image

    run = _write_log(tmp_path)
    out = plot_jsonl(run, metrics=["loss"], dpi=80)
    assert out == run / "metrics.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(out)[..., :3]
    line_color = colors.to_rgb("C0")  # the first line's colour
    rows, cols = (abs(pixels - line_color).sum(axis=-1) < 0.1).nonzero()
    assert len(cols) > 100  # the curve is drawn
    left, right = cols.min(), cols.max()
    left_rows = rows[cols < left + (right - left) * 0.1]
    right_rows = rows[cols > right - (right - left) * 0.1]
    assert left_rows.mean() < right_rows.mean()  # image rows grow downwards: the loss falls


def test_unknown_metric_lists_what_is_there(tmp_path):
    run = _write_log(tmp_path)
    with pytest.raises(ValueError, match=r"\['acc'\].*\['loss', 'lr'\]"):
        plot_jsonl(run, tmp_path / "x.png", metrics=["acc"])


def test_step_metrics_png_draws_the_logged_step_metrics(tmp_path):
    from accel_tracking import STEP_METRICS, plot_step_metrics

    tracker = JSONLTracker("run", tmp_path)
    for step in range(1, 6):
        tracker.log({"loss": 1.0, "perf/samples_per_sec": 100.0 * step, "perf/mfu": 0.1}, step=step)
    tracker.finish()
    png = plot_step_metrics(tmp_path / "run")
    assert png == tmp_path / "run" / "step_metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    figure = jsonl_figure(
        tmp_path / "run", [m for m in STEP_METRICS if "samples" in m or "mfu" in m]
    )
    assert [ax.get_title() for ax in figure.axes if ax.get_visible()] == [
        "perf/samples_per_sec",
        "perf/mfu",
    ]


def test_step_metrics_png_refuses_a_log_without_them(tmp_path):
    from accel_tracking import plot_step_metrics

    run = _write_log(tmp_path)
    with pytest.raises(ValueError, match="log_step_metrics=True"):
        plot_step_metrics(run)
