"""Familiar path `accelerate.commands`: re-exports from the packages that own the code."""

__all__ = []
