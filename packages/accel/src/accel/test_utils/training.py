"""Familiar path `accelerate.test_utils.training`: re-exports from the modules that own the code."""

from accel._compat._test_utils_training import (
    RegressionDataset,
    RegressionModel,
)

__all__ = [
    "RegressionDataset",
    "RegressionModel",
]
