"""The check `accel.big_modeling` keeps for sequence parallelism: recurrent layers are refused."""

from types import SimpleNamespace

import pytest

from accel.big_modeling import _refuse_recurrent_layers_under_sequence_parallelism as refuse


def _model(layer_types: list[str] | None) -> SimpleNamespace:
    config = SimpleNamespace(layer_types=layer_types)
    config.get_text_config = lambda: config
    return SimpleNamespace(config=config)


def test_linear_attention_layers_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"\['linear_attention'\]"):
        refuse(_model(["full_attention", "linear_attention", "linear_attention"]))


def test_full_attention_and_models_without_layer_types_pass() -> None:
    refuse(_model(["full_attention", "sliding_attention"]))
    refuse(_model(None))
    refuse(SimpleNamespace())  # no config at all
