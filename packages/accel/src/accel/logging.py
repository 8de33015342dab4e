"""Familiar path `accelerate.logging`: re-exports from the packages that own the code."""

from accel._logging import MultiProcessAdapter, get_logger

__all__ = ["MultiProcessAdapter", "get_logger"]
