"""Familiar path `accelerate.commands.utils`: re-exports from the packages that own the code."""

__all__ = []
