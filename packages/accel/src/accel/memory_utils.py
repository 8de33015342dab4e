"""Familiar path `accelerate.memory_utils`: re-exports from the packages that own the code."""

__all__ = []
