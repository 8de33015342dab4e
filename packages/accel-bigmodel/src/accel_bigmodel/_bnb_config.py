"""`BnbQuantizationConfig`: accelerate's bitsandbytes settings, validated when built.

Plain data (bitsandbytes is not imported): it builds, checks its fields and resolves its
dtypes as accelerate's does; `accel_bigmodel.quantization` acts on it.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from accel_bigmodel._sizes import CustomDtype

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_QUANT_TYPES = ("fp4", "nf4")
_DEFAULT_INT8_THRESHOLD = 6.0


def _require(ok: bool, name: str, value: object, accepted: str) -> None:
    if not ok:
        raise ValueError(f"BnbQuantizationConfig({name}={value!r}): {name} must be {accepted}.")


def _dtype(name: str, value: object) -> torch.dtype:
    """`value` ("fp32", "fp16", "bf16" or a torch.dtype) as a torch.dtype."""
    if isinstance(value, str):
        _require(value in _DTYPES, name, value, f"one of {sorted(_DTYPES)} or a torch.dtype")
        return _DTYPES[value]
    _require(isinstance(value, torch.dtype), name, value, "a string or a torch.dtype")
    return value  # type: ignore[return-value]


@dataclasses.dataclass
class BnbQuantizationConfig:
    """Settings for bitsandbytes 8-bit or 4-bit loading; exactly one of `load_in_8bit` and
    `load_in_4bit` is True. After construction the dtype fields are torch dtypes
    (`torch_dtype` defaults to fp16 for 8-bit, to the compute dtype for 4-bit) and
    `target_dtype` is `torch.int8` or `CustomDtype.INT4`."""

    load_in_8bit: bool = False
    llm_int8_threshold: float = _DEFAULT_INT8_THRESHOLD
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        self._check_mode()
        _require(
            isinstance(self.llm_int8_threshold, (int, float)),
            "llm_int8_threshold",
            self.llm_int8_threshold,
            "a float or an int",
        )
        _require(
            isinstance(self.bnb_4bit_quant_type, str) and self.bnb_4bit_quant_type in _QUANT_TYPES,
            "bnb_4bit_quant_type",
            self.bnb_4bit_quant_type,
            f"one of {list(_QUANT_TYPES)}",
        )
        _require(
            isinstance(self.bnb_4bit_use_double_quant, bool),
            "bnb_4bit_use_double_quant",
            self.bnb_4bit_use_double_quant,
            "a bool",
        )
        self.bnb_4bit_compute_dtype = _dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype)
        for name in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, name)
            _require(value is None or isinstance(value, list), name, value, "a list of strings")
        self.target_dtype: torch.dtype | str = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != _DEFAULT_INT8_THRESHOLD:
            warnings.warn(
                f"llm_int8_threshold={self.llm_int8_threshold!r} is ignored with load_in_4bit=True:"
                " it applies only to models loaded in 8 bit.",
                stacklevel=3,
            )
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype("torch_dtype", self.torch_dtype)

    def _check_mode(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit"):
            _require(isinstance(getattr(self, name), bool), name, getattr(self, name), "a bool")
        if self.load_in_8bit == self.load_in_4bit:
            raise ValueError(
                f"BnbQuantizationConfig(load_in_8bit={self.load_in_8bit}, "
                f"load_in_4bit={self.load_in_4bit}): set exactly one of them to True."
            )
