"""Familiar path `accelerate.logging`."""

from accel._logging import MultiProcessAdapter, get_logger

__all__ = ["MultiProcessAdapter", "get_logger"]
