"""accelerate.big_modeling's check a model must pass before its sequence is sharded across
ranks (Ulysses / context parallelism)."""

from __future__ import annotations

from typing import Any


def _refuse_recurrent_layers_under_sequence_parallelism(model: Any) -> None:
    """Raise a ValueError when `model` has linear-attention layers (``config.layer_types``).

    Such layers carry a state along the sequence inside the model's own code, so sharding the
    sequence restarts that state on every rank: the gradients come out wrong without an error.
    """
    config = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    recurrent = sorted({t for t in layer_types if "linear_attention" in str(t)})
    if recurrent:
        raise ValueError(
            f"Sequence parallelism cannot shard {type(model).__name__}: its layers of type "
            f"{recurrent} carry a recurrent state along the sequence, which each rank would "
            f"restart from zero (wrong gradients, no error). Use a model with full attention "
            f"only, or turn sequence parallelism off (sp_size=1)."
        )
