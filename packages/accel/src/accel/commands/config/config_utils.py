"""Familiar path `accelerate.commands.config.config_utils`: re-exports from the packages that own the code."""

__all__ = []
