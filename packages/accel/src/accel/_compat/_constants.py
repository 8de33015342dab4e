"""File names and fixed values that code written for accelerate imports by name."""

from __future__ import annotations

MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
TORCH_DISTRIBUTED_OPERATION_TYPES = [
    "MULTI_GPU",
    "FSDP",
    "MULTI_CPU",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_MUSA",
    "MULTI_HPU",
]
TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
    "standalone", "max_restarts", "monitor_interval", "start_method", "role", "module",
    "m", "no_python", "run_path", "log_dir", "r", "redirects", "t", "tee", "node_rank",
    "master_addr", "master_port",
]  # fmt: skip
# The option names of accelerate's FSDP settings, as transformers validates them.
FSDP_SHARDING_STRATEGY = [
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
