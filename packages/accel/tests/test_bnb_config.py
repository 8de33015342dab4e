"""BnbQuantizationConfig builds and validates like accelerate's; accelerate's paths serve accel's
quantized loading (accel_bigmodel.quantization, tested there)."""

import warnings

import pytest
import torch

from accel.utils import BnbQuantizationConfig, CustomDtype, load_and_quantize_model
from accel.utils.bnb import BnbQuantizationConfig as from_bnb
from accel.utils.dataclasses import BnbQuantizationConfig as from_dataclasses


def test_one_class_on_every_familiar_path():
    assert BnbQuantizationConfig is from_bnb is from_dataclasses


def test_8bit_defaults_resolve_dtypes():
    config = BnbQuantizationConfig(load_in_8bit=True)
    assert config.torch_dtype is torch.float16
    assert config.bnb_4bit_compute_dtype is torch.float16
    assert config.target_dtype is torch.int8
    assert config.skip_modules is None and config.keep_in_fp32_modules is None


def test_4bit_takes_compute_dtype_and_names():
    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert config.torch_dtype is torch.bfloat16
    assert config.target_dtype == CustomDtype.INT4
    assert BnbQuantizationConfig(load_in_4bit=True, torch_dtype="fp32").torch_dtype is torch.float32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"load_in_8bit": True, "load_in_4bit": True}, "exactly one"),
        ({}, "exactly one"),
        ({"load_in_8bit": 1}, "load_in_8bit"),
        ({"load_in_8bit": True, "llm_int8_threshold": "6"}, "llm_int8_threshold"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, "'fp4', 'nf4'"),
        ({"load_in_4bit": True, "bnb_4bit_use_double_quant": "yes"}, "double_quant"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp64"}, "fp64"),
        ({"load_in_4bit": True, "bnb_4bit_compute_dtype": 16}, "compute_dtype"),
        ({"load_in_8bit": True, "skip_modules": "lm_head"}, "skip_modules"),
        ({"load_in_8bit": True, "keep_in_fp32_modules": ("a",)}, "keep_in_fp32_modules"),
        ({"load_in_8bit": True, "torch_dtype": "int8"}, "torch_dtype"),
        ({"load_in_8bit": True, "torch_dtype": 3}, "torch_dtype"),
    ],
)
def test_bad_fields_raise_value_error_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BnbQuantizationConfig(**kwargs)


def test_int8_threshold_with_4bit_warns():
    with pytest.warns(UserWarning, match="llm_int8_threshold"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BnbQuantizationConfig(load_in_8bit=True, llm_int8_threshold=3)


def test_familiar_paths_serve_accel_bigmodel_quantization():
    import accel.utils.bnb as bnb_path
    from accel_bigmodel import quantization

    assert load_and_quantize_model is quantization.load_and_quantize_model
    for name in quantization.__all__:
        assert getattr(bnb_path, name) is getattr(quantization, name), name
