"""`BnbQuantizationConfig` at accelerate's paths: the class accel_bigmodel.quantization owns."""

from accel_bigmodel.quantization import BnbQuantizationConfig

__all__ = ["BnbQuantizationConfig"]
