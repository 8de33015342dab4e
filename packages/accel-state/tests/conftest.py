"""Fixtures of accel-state's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accel_state import PartialState
from accel_state._environment import ENV_ACCEL_CONFIG, ENV_TORCH_DEVICE


@pytest.fixture
def single_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher's rank, world size, accel config or device override in the environment, and
    no topology before or after the test: a PartialState made in it is one plain process's."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", ENV_ACCEL_CONFIG, ENV_TORCH_DEVICE):
        monkeypatch.delenv(name, raising=False)
    PartialState._reset_state()
    yield
    PartialState._reset_state()
