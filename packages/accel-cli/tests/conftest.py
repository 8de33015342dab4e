"""Keep every accel-cli test away from the user's own default config file; skip the tests
that need a sibling package where accel-cli is installed alone.

`@pytest.mark.needs("accel_parallel", ...)`: the test runs what accel-cli reaches lazily (a
worker that imports accel, merge-weights through accel-parallel, the headers through
accel-bigmodel). Installed alone (.ci/run), accel-cli has none of them, and such a test skips
naming what is missing; in the workspace they are all there and it runs.
"""

from __future__ import annotations

import importlib.util

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        missing = [name for name in mark.args if importlib.util.find_spec(name) is None]
        if missing:
            pytest.skip(f"needs {', '.join(missing)}, not installed with accel-cli alone")


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    monkeypatch.delenv("ACCEL_LAUNCH_CONFIG", raising=False)
