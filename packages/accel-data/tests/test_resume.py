"""A loader position saved on one number of processes, continued on another."""

from __future__ import annotations

import pytest

from accel_data import continue_data_position


def test_same_global_batch_continues_exactly() -> None:
    state = {"epoch": 0, "batches_yielded": 3, "num_processes": 2, "loader": {}}
    got, note = continue_data_position(state, saved_total=8, now_total=8, num_processes=4)
    assert got["batches_yielded"] == 3 and got["num_processes"] == 4 and note is None
    assert got["loader"]["total_batch_size"] == 8


def test_another_global_batch_continues_at_the_same_sample() -> None:
    state = {"epoch": 1, "batches_yielded": 4, "num_processes": 2}
    got, note = continue_data_position(state, saved_total=8, now_total=16, num_processes=4)
    assert got["batches_yielded"] == 2 and note is None
    got, note = continue_data_position(state, saved_total=8, now_total=12, num_processes=3)
    assert got["batches_yielded"] == 2  # 32 samples consumed: 24 skipped, 8 seen again
    assert note is not None and "8 samples of the epoch are seen again" in note


def test_varying_batches_have_no_position() -> None:
    state = {"epoch": 0, "batches_yielded": 2, "num_processes": 2}
    with pytest.raises(ValueError, match="cannot be computed"):
        continue_data_position(state, saved_total=None, now_total=8, num_processes=1)
    fresh = {**state, "batches_yielded": 0}
    assert continue_data_position(fresh, None, 8, 1)[1] is None
