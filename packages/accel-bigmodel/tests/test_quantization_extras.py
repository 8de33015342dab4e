"""Quantized loading without its optional libraries: the error names the extra to install."""

import pytest
import torch


def test_quantized_loading_without_its_library_names_the_extra(monkeypatch) -> None:
    import sys

    from accel_bigmodel.quantization import BnbQuantizationConfig, load_and_quantize_model

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'accel-bigmodel\[bnb\]'"):
        load_and_quantize_model(torch.nn.Linear(2, 2), BnbQuantizationConfig(load_in_8bit=True))
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    monkeypatch.setitem(sys.modules, "torchao", None)
    from accel_bigmodel._ao_load import import_quantize

    with pytest.raises(ImportError, match=r"pip install 'accel-bigmodel\[ao\]'"):
        import_quantize()
