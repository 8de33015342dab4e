"""Sequence parallel inside tensor parallel (Megatron-LM's ``sequence_parallelism``).

Between the tensor-parallel blocks, the activations (the residual stream, the layer norms and
any dropout on it) are split along the sequence over the ``tp`` ranks instead of being held
whole by each. Each block gathers its input back to the whole sequence, its column-split
layers run as before, and its row-split output layer reduce-scatters along the sequence
instead of all-reducing. Same numbers as plain tensor parallel, less activation memory.

For a transformers decoder model (``layers.*.input_layernorm / self_attn /
post_attention_layernorm / mlp``, ``norm``, ``lm_head``: Llama, Mistral, Qwen2 and their kin)
accel lays the regions out itself on top of the model's tensor-parallel plan. Any other model
needs a plan that lays them out: one with ``"sequence_parallel"`` entries (torch's
`SequenceParallel`) and styles whose input and output layouts match them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from accel_parallel._pipeline_hf import decoder_base

_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


def _convert(x: Any, mesh: Any, split: bool) -> Any:
    """The whole sequence -> this rank's slice of it (`split`), or back."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(x, torch.Tensor) or isinstance(x, DTensor):
        return x
    if split and x.shape[1] % mesh.size():
        raise ValueError(
            f"sequence parallel: a sequence of {x.shape[1]} tokens does not split evenly over "
            f"the {mesh.size()} tensor-parallel ranks; use a sequence length that "
            f"{mesh.size()} divides (pad to a multiple), or sequence_parallelism=False."
        )
    given, wanted = (Replicate(), Shard(1)) if split else (Shard(1), Replicate())
    dt = DTensor.from_local(x, mesh, [given], run_check=False)
    return dt.redistribute(mesh, [wanted]).to_local()


@functools.cache
def _sequence_style() -> type:
    from torch.distributed.tensor.parallel import ParallelStyle

    class _SequenceBoundary(ParallelStyle):
        """Converts a module's hidden-states input (``hidden_states=`` or the first positional
        argument): split along the sequence (entering the sequence-parallel region) or
        gathered whole (entering a tensor-parallel block)."""

        def __init__(self, split: bool) -> None:
            self.split = split

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                if "hidden_states" in kwargs:
                    kwargs["hidden_states"] = _convert(
                        kwargs["hidden_states"], device_mesh, self.split
                    )
                elif args:
                    args = (_convert(args[0], device_mesh, self.split), *args[1:])
                return args, kwargs

            module.register_forward_pre_hook(hook, with_kwargs=True)
            return module

    return _SequenceBoundary


def sequence_parallel_plan(model: nn.Module, resolved: dict[str, Any]) -> dict[str, Any]:
    """`resolved` (module name -> ParallelStyle) with the sequence-parallel regions laid out
    (see the module docstring); errors name the model and the fix."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    if any(isinstance(style, SequenceParallel) for style in resolved.values()):
        return resolved  # the plan lays the regions out itself
    base = decoder_base(model)
    if base is None or not hasattr(model, "config"):
        raise ValueError(
            f"sequence parallel (MegatronLMPlugin(sequence_parallelism=True) / TorchTensorParallel"
            f"Config(sequence_parallel=True)): {type(model).__name__} is not a transformers "
            f"decoder model, so accel cannot tell where its sequence-parallel regions are. Give "
            f"a tensor-parallel plan that lays them out (ParallelismConfig(tp_plan={{'...norm': "
            f"'sequence_parallel', ...}}) or torch ParallelStyles), or turn sequence parallel off."
        )
    boundary = _sequence_style()
    prefix = model.base_model_prefix
    plan = dict(resolved)
    for i, layer in enumerate(base.layers):
        name = f"{prefix}.layers.{i}"
        _check_layer(model, name, layer, resolved)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            plan[f"{name}.{norm}"] = SequenceParallel(use_local_output=True)
        for block in ("self_attn", "mlp"):
            plan[f"{name}.{block}"] = boundary(split=False)
            for inner, style in resolved.items():
                if inner.startswith(f"{name}.{block}.") and isinstance(style, RowwiseParallel):
                    plan[inner] = RowwiseParallel(output_layouts=Shard(1))
    plan[f"{prefix}.layers.0"] = boundary(split=True)
    plan[f"{prefix}.norm"] = SequenceParallel(use_local_output=True)
    plan["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return plan


def _check_layer(model: nn.Module, name: str, layer: nn.Module, resolved: dict[str, Any]) -> None:
    from torch.distributed.tensor.parallel import RowwiseParallel

    weighted = {n for n, child in layer.named_children() if list(child.parameters())}
    unknown = sorted(weighted - set(_LAYER_PARTS))
    missing = [p for p in _LAYER_PARTS if not hasattr(layer, p)]
    unsplit = [
        block
        for block in ("self_attn", "mlp")
        if not any(
            n.startswith(f"{name}.{block}.") and isinstance(s, RowwiseParallel)
            for n, s in resolved.items()
        )
    ]
    if unknown or missing or unsplit:
        what = (
            f"has {unknown} beside {list(_LAYER_PARTS)}"
            if unknown
            else f"lacks {missing}"
            if missing
            else f"has no row-split output layer in its tensor-parallel plan for {unsplit}"
        )
        raise ValueError(
            f"sequence parallel: {type(model).__name__}'s decoder layer {name!r} {what}, so "
            f"accel cannot lay out its sequence-parallel regions. Give a tensor-parallel plan "
            f"with 'sequence_parallel' entries (ParallelismConfig(tp_plan=...)), or turn "
            f"sequence parallel off."
        )
