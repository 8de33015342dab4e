"""Keep every accel-cli test away from the user's own default config file."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    monkeypatch.delenv("ACCEL_LAUNCH_CONFIG", raising=False)
