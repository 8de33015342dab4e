"""`MegatronLMPlugin`: accelerate's Megatron-LM fields, translated onto the one device mesh.

accel does not run NVIDIA's Megatron-LM: it maps what the plugin asks for onto its own
`ParallelismConfig` (``tp_degree`` -> ``tp_size``, ``pp_degree`` / ``num_micro_batches`` ->
``pp_size`` / ``pp_microbatches``, ``use_distributed_optimizer`` -> ``dp_shard_size`` (FSDP2
shards the optimizer state, and the weights, over the data-parallel ranks),
``context_parallel_size`` -> ``cp_size``, ``sequence_parallelism`` -> sequence-parallel norms
and dropout in the tensor-parallel plan, `accel_parallel._tp_sequence`),
``recompute_activations`` onto activation checkpointing and ``gradient_clipping`` onto a
global-norm clip at each optimizer step.
Every other field must keep its default: one that is set is refused, naming it. Models
built with Megatron-LM's own classes are out of scope; transformers and plain torch models
are split by accel's plans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from accel_parallel._parallelism_config import ParallelismConfig, TorchTensorParallelConfig

# Fields accel maps (the rest must keep accelerate's default).
_HONOURED = (
    "tp_degree", "pp_degree", "num_micro_batches", "gradient_clipping",
    "recompute_activations", "use_distributed_optimizer", "context_parallel_size",
    "recompute_granularity", "sequence_parallelism",
)  # fmt: skip
_WHY = {
    "num_layers_per_virtual_pipeline_stage": "use ParallelismConfig(pp_schedule="
    "'Interleaved1F1B', pp_virtual_stages=N) for virtual stages",
    "custom_loss_function": "give the loss with ParallelismConfig(pp_loss_fn=...)",
}


@dataclasses.dataclass
class MegatronLMPlugin:
    """accelerate's MegatronLMPlugin fields (same names, order and defaults); see the module
    docstring for what each becomes."""

    tp_degree: int | None = None
    pp_degree: int | None = None
    use_custom_fsdp: bool | None = None
    overlap_cpu_optimizer_d2h_h2d: bool | None = None
    no_load_optim: bool | None = None
    eod_mask_loss: bool | None = None
    no_save_optim: bool | None = None
    optimizer_cpu_offload: bool | None = None
    use_precision_aware_optimizer: bool | None = None
    decoder_last_pipeline_num_layers: int | None = None
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    attention_backend: bool | None = None
    expert_model_parallel_size: int | None = None
    context_parallel_size: int | None = None
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    attention_softmax_in_fp32: bool | None = None
    expert_tensor_parallel_size: int | None = None
    calculate_per_token_loss: bool | None = None
    use_rotary_position_embeddings: bool | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable | None = None
    scale_lr_cond: Callable | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Callable | None = None
    custom_prepare_model_function: Callable | None = None
    custom_megatron_datasets_provider_function: Callable | None = None
    custom_get_batch_function: Callable | None = None
    custom_loss_function: Callable | None = None
    other_megatron_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name in _HONOURED:
                continue
            value = getattr(self, field.name)
            if value is None or value == field.default or (value is False and not field.default):
                continue
            why = _WHY.get(field.name, "it configures Megatron-LM's own engine, which accel "
                           "does not run; leave it at its default")  # fmt: skip
            raise ValueError(f"MegatronLMPlugin({field.name}={value!r}) is not supported: {why}.")
        if self.recompute_granularity not in (None, "full"):
            raise ValueError(
                f"MegatronLMPlugin(recompute_granularity={self.recompute_granularity!r}): accel "
                f"recomputes whole blocks only; use 'full' (or recompute_activations=True)."
            )
        for name in ("tp_degree", "pp_degree", "num_micro_batches", "context_parallel_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"MegatronLMPlugin({name}={value!r}): expected a whole number >= 1."
                )
        if self.sequence_parallelism and (self.tp_degree or 1) == 1:
            raise ValueError(
                f"MegatronLMPlugin(sequence_parallelism=True, tp_degree={self.tp_degree}): "
                f"sequence parallelism splits the activations of a tensor-parallel group along "
                f"the sequence, and there is no such group; set tp_degree > 1, or "
                f"sequence_parallelism=False."
            )

    @property
    def recompute(self) -> bool:
        return bool(self.recompute_activations) or self.recompute_granularity == "full"

    def to_parallelism_config(self, world_size: int) -> ParallelismConfig:
        """The ParallelismConfig this plugin asks for on `world_size` processes."""
        tp, pp = self.tp_degree or 1, self.pp_degree or 1
        cp = self.context_parallel_size or 1
        model = tp * pp * cp
        if world_size % model:
            raise ValueError(
                f"MegatronLMPlugin(tp_degree={tp}, pp_degree={pp}, context_parallel_size={cp}) "
                f"needs a multiple of {model} processes; the run has {world_size}."
            )
        dp = world_size // model
        sizes: dict[str, Any] = {"tp_size": tp, "cp_size": cp}
        if self.sequence_parallelism:
            sizes["tp_handler"] = TorchTensorParallelConfig(sequence_parallel=True)
        if dp > 1 and self.use_distributed_optimizer:
            sizes["dp_shard_size"] = dp
        elif dp > 1 and model > 1:
            raise ValueError(
                f"MegatronLMPlugin(use_distributed_optimizer={self.use_distributed_optimizer}) "
                f"with {dp} data-parallel ranks beside tensor/pipeline parallel: accel's data "
                f"parallel over these is FSDP2; set use_distributed_optimizer=True."
            )
        elif dp > 1:
            sizes["dp_replicate_size"] = dp
        if pp > 1:
            sizes.update(pp_size=pp, pp_microbatches=self.num_micro_batches)
        elif (self.num_micro_batches or 1) > 1:
            raise ValueError(
                f"MegatronLMPlugin(num_micro_batches={self.num_micro_batches}) without a pipeline "
                f"(pp_degree=1) is gradient accumulation: use Accelerator(gradient_accumulation_"
                f"steps={self.num_micro_batches})."
            )
        if self.recompute and pp == 1 and not sizes.get("dp_shard_size"):
            raise ValueError(
                "MegatronLMPlugin(recompute_activations=True) recomputes the blocks of a pipeline "
                "or FSDP2 run; with neither (pp_degree=1 and no distributed optimizer) use "
                "gradient checkpointing on the model itself."
            )
        return ParallelismConfig(**sizes)

    @classmethod
    def from_launch_config(cls, section: Mapping[str, Any]) -> MegatronLMPlugin:
        """From the ``megatron_lm_config`` section `accel launch` hands down (accelerate's YAML
        keys, ``megatron_lm_tp_degree`` ...)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for key, value in section.items():
            name = str(key).removeprefix("megatron_lm_")
            if name not in names:
                raise ValueError(
                    f"megatron_lm_config: unknown key {key!r}; accepted: megatron_lm_<field> for "
                    f"the fields of MegatronLMPlugin."
                )
            if value is not None:
                values[name] = value
        for name, value in values.items():  # flags and quoted YAML give strings
            text = str(value).strip().lower() if isinstance(value, str) else None
            if text in ("true", "yes", "false", "no"):
                values[name] = text in ("true", "yes")
        return cls(**values)


def megatron_settings(
    plugin: MegatronLMPlugin | None,
    launch: Mapping[str, Any],
    *,
    world_size: int,
    parallelism_config: Any,
    fsdp_plugin: Any,
) -> tuple[Any, Any, float | None]:
    """(parallelism_config, fsdp_plugin, clip norm) for a run given a MegatronLMPlugin, or
    launched with ``--use_megatron_lm`` (``distributed_type: MEGATRON_LM``); unchanged
    without either."""
    if plugin is None and str(launch.get("distributed_type", "")).upper() == "MEGATRON_LM":
        plugin = MegatronLMPlugin.from_launch_config(launch.get("megatron_lm_config") or {})
    if plugin is None:
        return parallelism_config, fsdp_plugin, None
    if parallelism_config is not None:
        raise ValueError(
            "Pass a MegatronLMPlugin or a ParallelismConfig (or torch_tp_plugin), not both: the "
            "plugin is translated into a ParallelismConfig."
        )
    config = plugin.to_parallelism_config(world_size)
    if plugin.recompute:
        from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin

        if fsdp_plugin is None:
            fsdp_plugin = FullyShardedDataParallelPlugin(activation_checkpointing=True)
        elif not fsdp_plugin.activation_checkpointing:
            raise ValueError(
                "MegatronLMPlugin(recompute_activations=True) with a FullyShardedDataParallelPlugin"
                "(activation_checkpointing=False): set one of them to agree."
            )
    clip = float(plugin.gradient_clipping) if plugin.gradient_clipping else None
    return config, fsdp_plugin, clip
