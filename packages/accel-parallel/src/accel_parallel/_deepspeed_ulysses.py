"""DeepSpeed's sequence parallel (ALST / Ulysses) for the DeepSpeed strategy, as accelerate 1.15
serves it: DeepSpeed's own `UlyssesSPAttentionHF` takes the place of the model's attention in
transformers (registered with ``disable_in_eval=True``, so that an evaluation on whole
sequences attends locally, as accelerate registers it), its sequence-parallel groups go to
`deepspeed.initialize` as ``mpu``, and DeepSpeed's `UlyssesSPDataLoaderAdapter` hands each rank
of a group its slice of every sample's sequence, with ``shift_labels``. The loss of a slice is
the loop's to aggregate over the group (accelerate's recipe: a differentiable all-gather of the
per-rank losses, weighted by their tokens).

One thing differs: with ``disable_in_eval`` a model in eval mode attends only to its own slice
of the sequence, and `from_pretrained` returns a model in eval mode. accel puts such a model in
train mode when it is prepared (with a warning), and refuses a backward through a forward run
in eval mode, so that no training step is computed from shard-local attention.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from accel_parallel._sequence_parallel import DeepSpeedSequenceParallelConfig

_DEFAULT_ATTENTION = "sdpa"  # accelerate's documented default for sp_attn_implementation


def refuse_recurrent_layers(model: nn.Module) -> None:
    """A ValueError when `model` has linear-attention layers (``config.layer_types``): they carry
    a state along the sequence inside the model's own code, so sharding the sequence restarts it
    on every rank (wrong gradients, no error)."""
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


class UlyssesSequenceParallel:
    """The sequence-parallel part of one DeepSpeed run: `sp_size` ranks share each sample.

    `register` (once per process, before `deepspeed.initialize`) puts DeepSpeed's Ulysses
    attention in place and returns its ``mpu``; `adapt_loader` wraps a prepared loader in
    DeepSpeed's adapter; `check_training` is called before each backward.
    """

    def __init__(self, sp_size: int, handler: DeepSpeedSequenceParallelConfig | None) -> None:
        self.sp_size = sp_size
        self.handler = handler or DeepSpeedSequenceParallelConfig()
        self.mpu: Any = None

    def register(self, model: nn.Module, micro_batch: int | None) -> Any:
        """Register Ulysses attention for `model` with transformers; DeepSpeed's ``mpu``."""
        if self.mpu is not None:
            raise ValueError(
                "DeepSpeed's sequence parallel serves one model per process (its attention is "
                "registered with transformers once, for one model's heads); prepare the other "
                "models without it, or in another process."
            )
        if not hasattr(model, "config"):
            raise ValueError(
                f"ParallelismConfig(sp_size={self.sp_size}) with DeepSpeed: the model "
                f"({type(model).__name__}) has no `config`; DeepSpeed's Ulysses attention "
                f"(UlyssesSPAttentionHF) serves transformers models only."
            )
        refuse_recurrent_layers(model)
        import deepspeed
        import torch.distributed as dist
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

        deepspeed.init_distributed(dist_backend=dist.get_backend())  # its groups need its comm

        handler = self.handler
        self.mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model,
            sequence_parallel_size=self.sp_size,
            seq_length=handler.sp_seq_length,
            seq_length_is_variable=handler.sp_seq_length_is_variable,
            core_attn_implementation=handler.sp_attn_implementation or _DEFAULT_ATTENTION,
            micro_batch_size=micro_batch or 1,
            disable_in_eval=True,
        )
        if not model.training:
            model.train()
            warnings.warn(
                f"ParallelismConfig(sp_size={self.sp_size}): the model came to prepare() in eval "
                f"mode (from_pretrained returns it so), where DeepSpeed's Ulysses attention is "
                f"off (registered with disable_in_eval=True, as accelerate does) and each rank "
                f"would attend only to its slice of the sequence. accel put it in train mode; "
                f"call model.eval() for evaluation on whole sequences and model.train() after it.",
                stacklevel=4,
            )
        return self.mpu

    def adapt_loader(self, loader: Any, device: Any) -> Any:
        """`loader` (already sharded over every process) wrapped in DeepSpeed's
        `UlyssesSPDataLoaderAdapter`: each rank gets, in turn, its slice of the samples of each
        rank of its group, with ``shift_labels`` in place of ``labels``."""
        if self.mpu is None:
            raise ValueError(
                "the sequence-parallel loader adapter needs the model prepared first: pass the "
                "model and the loader to the same prepare() call, or call "
                "accelerator.deepspeed_ulysses_dl_adapter(loader, model) after prepare(model)."
            )
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

        return UlyssesSPDataLoaderAdapter(
            loader,
            sp_rank=self.mpu.get_sequence_parallel_rank(),
            sp_group=self.mpu.get_sequence_parallel_group(),
            sp_world_size=self.mpu.get_sequence_parallel_world_size(),
            device=device,
        )

    def check_training(self, module: nn.Module) -> None:
        """Refuse a backward through a forward that ran in eval mode (shard-local attention)."""
        if not module.training:
            raise RuntimeError(
                f"backward under sequence parallel (sp_size={self.sp_size}) through a forward "
                f"run in eval mode: DeepSpeed's Ulysses attention is off in eval mode, so each "
                f"rank attended only to its slice of the sequence and these gradients are wrong. "
                f"Call model.train() before the training forward (to train without dropout, set "
                f"the dropout probabilities of the model's config to 0)."
            )
