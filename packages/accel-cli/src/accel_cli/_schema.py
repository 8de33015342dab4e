"""The config-file vocabulary: accelerate's YAML keys and what accel does with each.

A key falls in exactly one group:
- USED: `accel launch` acts on it (it maps to a `LaunchConfig` field);
- HANDED_DOWN: passed unchanged to the workers in the launch JSON, for the Accelerator;
- REFUSED: a feature accel does not provide (TPU, SageMaker, Megatron-LM, the engines not
  built yet); accepted at its inert default, otherwise `accel launch` refuses it before
  anything starts, naming the key, why, and what to use instead;
- NOTED: accelerate's questionnaire records it and neither tool acts on it at launch;
- anything else is an error naming the closest known key.
"""

from __future__ import annotations

from typing import Any

PRECISIONS = ("no", "fp16", "bf16", "fp8", "fp16-true", "bf16-true")

DISTRIBUTED_TYPES = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_HPU",
    "MULTI_NEURON",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
)
# The distributed types that name a strategy rather than a topology: handed to the workers.
STRATEGY_TYPES = ("DEEPSPEED", "FSDP", "MEGATRON_LM")

COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE", "AMAZON_SAGEMAKER")

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")

# YAML key -> LaunchConfig field.
USED_KEYS: dict[str, str] = {
    "num_processes": "num_processes",
    "num_machines": "num_machines",
    "machine_rank": "machine_rank",
    "main_process_ip": "main_process_ip",
    "main_process_port": "main_process_port",
    "mixed_precision": "mixed_precision",
    "use_cpu": "cpu",
    "gpu_ids": "gpu_ids",
    "rdzv_backend": "rdzv_backend",
    "enable_cpu_affinity": "enable_cpu_affinity",
    "same_network": "same_network",
    "debug": "debug",
    # accel's own additions (accelerate passes these as flags only).
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "backend": "backend",
}

# Read by the launcher for validation or derivation, not mapped one-to-one to a field
# (a top-level dynamo_backend is the old spelling of dynamo_config.dynamo_backend).
SPECIAL_KEYS = ("compute_environment", "distributed_type", "fp16", "dynamo_backend")

# Nested sections handed down as-is, with the keys accelerate writes in each.
_FSDP_KEYS = (
    "fsdp_version",
    "fsdp_offload_params",
    "fsdp_min_num_params",
    "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch",
    "fsdp_state_dict_type",
    "fsdp_forward_prefetch",
    "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states",
    "fsdp_activation_checkpointing",
    "fsdp_activation_checkpointing_offload",
    "fsdp_ignored_modules",
)
_DEEPSPEED_KEYS = (
    "deepspeed_config_file",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_multinode_launcher",
    "deepspeed_moe_layer_cls_names",
)
_FP8_KEYS = (
    "backend",
    "fp8_format",
    "margin",
    "interval",
    "amax_history_length",
    "amax_compute_algorithm",
    "override_linear_precision",
    "use_autocast_during_eval",
    "optimization_level",
    "pad_inner_dim",
    "enable_fsdp_float8_all_gather",
)
_PARALLELISM_KEYS = tuple(
    "parallelism_config_" + k
    for k in (
        "dp_replicate_size",
        "dp_shard_size",
        "tp_size",
        "cp_size",
        "cp_backend",
        "cp_comm_strategy",
        "sp_size",
        "sp_backend",
        "sp_seq_length",
        "sp_seq_length_is_variable",
        "sp_attn_implementation",
    )
)
# accelerate's megatron_lm_config keys (the MegatronLMPlugin fields, prefixed).
_MEGATRON_KEYS = tuple(
    "megatron_lm_" + k
    for k in (
        "tp_degree", "pp_degree", "num_micro_batches", "gradient_clipping",
        "sequence_parallelism", "recompute_activations", "use_distributed_optimizer",
        "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d",
        "no_save_optim", "optimizer_cpu_offload", "use_precision_aware_optimizer",
        "decoder_last_pipeline_num_layers", "recompute_granularity", "recompute_method",
        "recompute_num_layers", "attention_backend", "expert_model_parallel_size",
        "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings", "pipeline_model_parallel_split_rank",
        "num_layers_per_virtual_pipeline_stage",
    )
)  # fmt: skip
_DYNAMO_KEYS = tuple(
    "dynamo_" + k
    for k in ("backend", "mode", "use_fullgraph", "use_dynamic", "use_regional_compilation")
)
HANDED_DOWN_SECTIONS: dict[str, tuple[str, ...]] = {
    "fsdp_config": _FSDP_KEYS,
    "deepspeed_config": _DEEPSPEED_KEYS,
    "fp8_config": _FP8_KEYS,
    "parallelism_config": _PARALLELISM_KEYS,
    "dynamo_config": _DYNAMO_KEYS,
    "megatron_lm_config": _MEGATRON_KEYS,
}
HANDED_DOWN_KEYS = tuple(HANDED_DOWN_SECTIONS)

_SAGEMAKER_KEYS = (
    "ec2_instance_type",
    "iam_role_name",
    "image_uri",
    "profile",
    "region",
    "base_job_name",
    "pytorch_version",
    "transformers_version",
    "py_version",
    "sagemaker_inputs_file",
    "sagemaker_metrics_file",
    "additional_args",
)
# Nested sections that are not handed down: their keys are checked too, so a misspelling
# anywhere in a file is caught (mpirun_config.mpirun_hostfile is used by the launcher).
CHECKED_SECTIONS: dict[str, tuple[str, ...]] = {
    "mpirun_config": ("mpirun_hostfile", "mpirun_ccl"),
}

_SAGEMAKER = (
    "SageMaker is not provided by accel: `accel launch` runs on this machine (use accelerate or "
    "the SageMaker SDK)"
)
# accelerate keys accel does not provide: (the value that asks for nothing, why and instead).
REFUSED_KEYS: dict[str, tuple[Any, str]] = dict.fromkeys(_SAGEMAKER_KEYS, (None, _SAGEMAKER))
# Keys only a TPU launch or `tpu-config` reads (the value that asks for nothing): accelerate's
# launch passes over them unless distributed_type is XLA (`accel launch --tpu`, which reads
# main_training_function and refuses the pod launcher's keys), so a config written for
# `tpu-config` launches as it does with accelerate; other launches note them.
TPU_ONLY_KEYS: dict[str, Any] = {
    "main_training_function": "main",
    "downcast_bf16": False,
    "tpu_name": None,
    "tpu_zone": None,
    "tpu_use_cluster": False,
    "tpu_use_sudo": False,
    "command_file": None,
    "commands": None,
    "tpu_vm": None,
    "tpu_env": None,
}
# Keys of sections accel does not provide: set to anything, they are refused.
REFUSED_SECTIONS: dict[str, str] = {}
# distributed_type values accel does not provide.
REFUSED_TYPES: dict[str, str] = {}

# Accepted and not acted on, by accelerate's launch either.
NOTED_KEYS: dict[str, Any] = {"mpirun_config.mpirun_ccl": None, **TPU_ONLY_KEYS}

ALL_KEYS = frozenset(
    (*USED_KEYS, *SPECIAL_KEYS, *HANDED_DOWN_KEYS, *REFUSED_KEYS, *TPU_ONLY_KEYS, *CHECKED_SECTIONS)
)


def is_inert(value: Any, default: Any = None) -> bool:
    """True when a value asks for nothing (so it needs no note and no refusal)."""
    if value in (None, False, "", "no", "NO") or value == {} or value == []:
        return True
    return value == default
