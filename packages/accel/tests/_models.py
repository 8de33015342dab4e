"""Small models and data shared by the umbrella's tests: they live in accel-testkit
(`accel_testkit.models`; the float32 arithmetic and its reasoning in
`accel_testkit.tolerance`), re-exported here for the modules that import them from here."""

from __future__ import annotations

from accel_testkit.models import RegressionData, loss_of, make_model
from accel_testkit.tolerance import (
    assert_same_forward,
    assert_same_losses,
    assert_same_training,
    float32_error,
    norm_terms,
    training_drift,
)

__all__ = [
    "RegressionData",
    "assert_same_forward",
    "assert_same_losses",
    "assert_same_training",
    "float32_error",
    "loss_of",
    "make_model",
    "norm_terms",
    "training_drift",
]
