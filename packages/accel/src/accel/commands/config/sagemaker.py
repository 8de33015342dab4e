"""Familiar path `accelerate.commands.config.sagemaker`: re-exports from the packages that own the code."""

__all__ = []
