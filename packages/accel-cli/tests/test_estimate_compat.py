"""accelerate's estimate-memory helpers (`accel.commands.estimate`), offline on a local model."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from accel_cli._estimate_compat import (
    check_has_model,
    create_empty_model,
    estimate_training_usage,
    gather_data,
)


def test_training_usage_has_accelerates_keys_and_sizes() -> None:
    assert estimate_training_usage(100, "float32") == {
        "model": 100,
        "optimizer": 200,
        "gradients": 100,
        "step": 400,
    }
    half = estimate_training_usage(100, "bfloat16")
    assert half == {"model": 100, "optimizer": 200, "gradients": 150, "step": 200}
    assert estimate_training_usage(100, "int8") == dict.fromkeys(half, -1)


def test_check_has_model_names_the_library() -> None:
    pytest.importorskip("transformers")
    assert check_has_model(OSError("x does not appear to have a file named config.json")) == (
        "transformers"
    )
    assert check_has_model(ValueError("something else")) == "unknown"


def test_gather_data_on_a_local_transformers_folder(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    config.save_pretrained(tmp_path)
    model = create_empty_model(str(tmp_path), library_name=None)
    assert next(model.parameters()).device.type == "meta"
    real = transformers.AutoModel.from_config(config)
    total = sum(t.numel() * 4 for t in [*real.parameters(), *real.buffers()])
    args = argparse.Namespace(
        model_name=str(tmp_path), library_name=None, trust_remote_code=False,
        dtypes=["float32", "float16"],
    )  # fmt: skip
    (f32, f32_layer, f32_total, f32_train), (f16, f16_layer, f16_total, _) = gather_data(args)
    assert (f32, f16) == ("float32", "float16")
    assert f32_total == total and f16_total == total / 2
    assert 0 < f32_layer < total and f16_layer == f32_layer / 2
    assert f32_train["step"] == 4 * total


def test_unknown_library_is_refused_with_the_choices(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="'transformers' or 'timm'"):
        create_empty_model(str(tmp_path), library_name="keras")
