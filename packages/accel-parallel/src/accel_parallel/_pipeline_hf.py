"""What the pipeline knows of transformers models, in one adapter.

A transformers decoder model (``model.<base>.embed_tokens / layers / norm / rotary_emb`` and
``lm_head``, as Llama, Mistral, Qwen2 and their kin have) is cut without a plan: its decoder
layers spread evenly over the stages (`decoder_stages`), the embedding on the first and the
norm and head on the last. Its loss is the model's own causal-LM loss (`transformers_loss`);
its input is ``input_ids`` (`pipeline_inputs`), and a padding ``attention_mask`` reaches
every stage (`padding_keywords`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class DecoderStage(nn.Module):
    """A slice of a transformers decoder: the embedding (first stage), some decoder layers,
    the norm and head (last stage). Positions and the causal mask are made on each stage."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        base = decoder_base(model)
        prefix = model.base_model_prefix
        self.config = model.config
        self.rotary = base.rotary_emb  # buffers only: every stage computes its positions
        self.unit_names: dict[str, str] = {}
        self.embed = base.embed_tokens if first else None
        if first:
            self.unit_names["embed"] = f"{prefix}.embed_tokens"
        self.layers = nn.ModuleList(base.layers[i] for i in layers)
        for j, i in enumerate(layers):
            self.unit_names[f"layers.{j}"] = f"{prefix}.layers.{i}"
        self.seq_shards = 1  # sequence parallel: the stages pass 1/seq_shards of the sequence
        self.norm = base.norm if last else None
        self.head = model.lm_head if last else None
        if last:
            self.unit_names.update({"norm": f"{prefix}.norm", "head": "lm_head"})

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`attention_mask`: this micro-batch's padding mask, handed to every stage by the
        schedule (None without padding)."""
        from transformers.masking_utils import create_causal_mask

        h = self.embed(x) if self.embed is not None else x
        length = x.shape[1] if self.embed is not None else h.shape[1] * self.seq_shards
        positions = torch.arange(length, device=h.device).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=h.new_empty((h.shape[0], length, 0)),
            attention_mask=attention_mask,
            past_key_values=None,
            position_ids=positions,
        )
        rotary = self.rotary(h, position_ids=positions)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
            h = h[0] if isinstance(h, tuple) else h
        if self.head is not None:
            h = self.head(self.norm(h))
        return h


def decoder_base(model: nn.Module) -> Any:
    base = getattr(model, getattr(model, "base_model_prefix", "") or "", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if (
        not isinstance(base, nn.Module)
        or not all(hasattr(base, n) for n in needed)
        or not hasattr(model, "lm_head")
    ):
        return None
    return base


def is_transformers_decoder(model: nn.Module) -> bool:
    return decoder_base(model) is not None and hasattr(model, "config")


def decoder_layer_count(model: nn.Module) -> int:
    """How many decoder layers a model cut without a plan has (refusing other models)."""
    if not is_transformers_decoder(model):
        names = [n for n, _ in model.named_children()]
        raise ValueError(
            f"pipeline parallel (pp_size > 1): {type(model).__name__} is not a transformers "
            f"decoder model (embed_tokens / layers / norm / lm_head), so it needs a plan: "
            f"ParallelismConfig(pp_plan=[...]) with its modules in the order they run, e.g. "
            f"{names} (see accel_parallel._pipeline_plan)."
        )
    return len(decoder_base(model).layers)


def decoder_stages(model: nn.Module, spans: list[range]) -> list[nn.Module]:
    """The stages of a transformers decoder model: its layers cut at `spans`."""
    last = len(spans) - 1
    return [DecoderStage(model, span, i == 0, i == last) for i, span in enumerate(spans)]


def pipeline_inputs(args: tuple, kwargs: dict) -> tuple:
    """The stages' input taken from a forward call: ``input_ids``, the one keyword given, or
    the positional tensors (`kwargs` is emptied of what was taken)."""
    name = "input_ids" if "input_ids" in kwargs else None
    if name is None and len(kwargs) == 1 and not args:
        name = next(iter(kwargs))
    inputs = (*args, kwargs.pop(name)) if name else args
    if kwargs or not inputs:
        raise ValueError(
            f"pipeline parallel: the prepared model takes its input (input_ids, or one "
            f"positional tensor) and labels=...; got keywords {sorted(kwargs)} and "
            f"{len(args)} positional arguments."
        )
    return tuple(inputs)


def padding_keywords(
    stages: list[nn.Module], model: nn.Module, mask: torch.Tensor | None, ids: torch.Tensor,
    device: torch.device,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The keywords that hand each stage its micro-batch's slice of a padding mask (every
    pipeline rank holds the whole batch); none for a mask without padding."""
    if mask is None or bool(torch.all(mask != 0)):
        return {}
    if not all(isinstance(s, DecoderStage) for s in stages):
        raise ValueError(
            f"pipeline parallel: a padding attention_mask reaches the stages of a transformers "
            f"decoder model only; {type(model).__name__} is cut by a module plan whose "
            f"stages take one input. Pack the sequences to one length (labels -100 where no "
            f"loss is wanted)."
        )
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(
            f"pipeline parallel: attention_mask of shape {tuple(mask.shape)} for input_ids of "
            f"shape {tuple(ids.shape)}; give a (batch, sequence) mask like the input_ids."
        )
    return {"attention_mask": mask.to(device)}


LossFn = Callable[[Any, Any], torch.Tensor]


class TokenLoss:
    """The causal-LM loss transformers' model computes from logits and labels. Where the
    labels ignore tokens (-100), each micro-batch's loss is its sum over the batch's counted
    tokens, times the micro-batch count (the schedule divides by it), so the mean over
    micro-batches is the loss of the whole batch, as one process computes it."""

    def __init__(self, model: nn.Module) -> None:
        self.vocab = model.config.vocab_size
        self.loss_function = model.loss_function
        self.items: torch.Tensor | None = None
        self.micro = 1

    def per_batch(self, labels: torch.Tensor | None, micro: int) -> None:
        """Set up for the batch whose labels are `labels` (None: an evaluation without)."""
        self.items, self.micro = None, micro
        if labels is not None and bool((labels == -100).any()):
            self.items = (labels[..., 1:] != -100).sum().clamp(min=1)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.items is None:
            return self.loss_function(logits=logits, labels=labels, vocab_size=self.vocab)
        total = self.loss_function(
            logits=logits, labels=labels, vocab_size=self.vocab, num_items_in_batch=self.items
        )
        return total * self.micro


def transformers_loss(model: nn.Module) -> LossFn:
    """The causal-LM loss of a transformers model (`TokenLoss`)."""
    return TokenLoss(model)
