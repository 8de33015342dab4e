"""Familiar path `accelerate.utils.deepspeed`: re-exports from the packages that own the code."""

__all__ = []
