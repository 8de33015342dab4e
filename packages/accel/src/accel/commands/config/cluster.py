"""Familiar path `accelerate.commands.config.cluster`: re-exports from the packages that own the code."""

__all__ = []
