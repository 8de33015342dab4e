"""DataLoaderConfiguration fields are assigned after creation by transformers' Trainer."""

from __future__ import annotations

import pytest

from accel_data import DataLoaderConfiguration


def test_assignment_is_validated() -> None:
    config = DataLoaderConfiguration(split_batches=True)
    config.data_seed = 7
    config.non_blocking = True
    assert config.prepare_kwargs()["data_seed"] == 7 and config.non_blocking
    with pytest.raises(TypeError, match="data_seed must be None or an int, got 'x'"):
        config.data_seed = "x"
    with pytest.raises(TypeError, match="even_batches must be a bool, got 1"):
        config.even_batches = 1
    with pytest.raises(AttributeError, match="no field 'seed'"):
        config.seed = 3
    with pytest.raises(TypeError, match="dispatch_batches must be None or a bool"):
        DataLoaderConfiguration(dispatch_batches="yes")
