"""Familiar path `accelerate.commands.config.config_args`: re-exports from the packages that own the code."""

__all__ = []
