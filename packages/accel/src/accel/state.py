"""Familiar path `accelerate.state`."""

from accel._accelerator_state import AcceleratorState
from accel._gradient_state import GradientState
from accel_state import DistributedType, PartialState

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState"]
