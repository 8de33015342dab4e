"""What the workspace's tests share (dev only, never published; no package imports it):
toy models and data (`accel_testkit.models`), the float32 tolerance of two runs of one
training (`accel_testkit.tolerance`), and the `accel` command line run as a subprocess
(`accel_testkit.launch`)."""

from __future__ import annotations

import importlib
from typing import Any

from accel_testkit.launch import LAUNCHER_VARS, accel_command, launch_command, worker_env

# The models and tolerances import torch: on first use, so the launch helpers work where
# torch is not installed (accel-tracking tested alone).
_LAZY = {
    **dict.fromkeys(["Block", "RegressionData", "Stack", "loss_of", "make_model"], "models"),
    **dict.fromkeys(
        [
            "assert_same_forward",
            "assert_same_losses",
            "assert_same_training",
            "float32_error",
            "norm_terms",
            "training_drift",
        ],
        "tolerance",
    ),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"accel_testkit.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'accel_testkit' has no attribute {name!r}")


__all__ = [
    "LAUNCHER_VARS",
    "Block",
    "RegressionData",
    "Stack",
    "accel_command",
    "assert_same_forward",
    "assert_same_losses",
    "assert_same_training",
    "float32_error",
    "launch_command",
    "loss_of",
    "make_model",
    "norm_terms",
    "training_drift",
    "worker_env",
]
