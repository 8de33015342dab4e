"""Familiar path `accelerate.utils.bnb`: re-exports from the packages that own the code."""

from accel._compat._left_out import has_4bit_bnb_layers, load_and_quantize_model

__all__ = ["has_4bit_bnb_layers", "load_and_quantize_model"]
