"""File names and fixed values that code written for accelerate imports by name (the
checkpoint file names are accel-parallel's, re-exported)."""

from __future__ import annotations

# defined once, in accel-cli (its config dataclasses and launcher use them)
from accel_cli.familiar import (
    DEEPSPEED_MULTINODE_LAUNCHERS as DEEPSPEED_MULTINODE_LAUNCHERS,
)
from accel_cli.familiar import (
    FSDP2_STATE_DICT_TYPE as FSDP2_STATE_DICT_TYPE,
)
from accel_cli.familiar import (
    SAGEMAKER_PARALLEL_EC2_INSTANCES as SAGEMAKER_PARALLEL_EC2_INSTANCES,
)
from accel_cli.familiar import (
    SAGEMAKER_PYTHON_VERSION as SAGEMAKER_PYTHON_VERSION,
)
from accel_cli.familiar import (
    SAGEMAKER_PYTORCH_VERSION as SAGEMAKER_PYTORCH_VERSION,
)
from accel_cli.familiar import (
    SAGEMAKER_TRANSFORMERS_VERSION as SAGEMAKER_TRANSFORMERS_VERSION,
)
from accel_cli.familiar import (
    TORCH_DYNAMO_MODES as TORCH_DYNAMO_MODES,
)

# checkpoint file names: accel-parallel's checkpoint layout owns them
from accel_parallel.checkpoint import FSDP_MODEL_NAME as FSDP_MODEL_NAME
from accel_parallel.checkpoint import MODEL_NAME as MODEL_NAME
from accel_parallel.checkpoint import OPTIMIZER_NAME as OPTIMIZER_NAME
from accel_parallel.checkpoint import RNG_STATE_NAME as RNG_STATE_NAME
from accel_parallel.checkpoint import SAFE_MODEL_NAME as SAFE_MODEL_NAME
from accel_parallel.checkpoint import SAFE_WEIGHTS_INDEX_NAME as SAFE_WEIGHTS_INDEX_NAME
from accel_parallel.checkpoint import SAFE_WEIGHTS_NAME as SAFE_WEIGHTS_NAME
from accel_parallel.checkpoint import SAFE_WEIGHTS_PATTERN_NAME as SAFE_WEIGHTS_PATTERN_NAME
from accel_parallel.checkpoint import SAMPLER_NAME as SAMPLER_NAME
from accel_parallel.checkpoint import SCALER_NAME as SCALER_NAME
from accel_parallel.checkpoint import SCHEDULER_NAME as SCHEDULER_NAME
from accel_parallel.checkpoint import WEIGHTS_INDEX_NAME as WEIGHTS_INDEX_NAME
from accel_parallel.checkpoint import WEIGHTS_NAME as WEIGHTS_NAME
from accel_parallel.checkpoint import WEIGHTS_PATTERN_NAME as WEIGHTS_PATTERN_NAME

PROFILE_PATTERN_NAME = "profile_{suffix}.json"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
# The distributed types whose collectives run on CUDA devices, then every torch.distributed one.
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = [
    *CUDA_DISTRIBUTED_TYPES,
    "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU",
    "MULTI_HPU", "MULTI_NEURON",
]  # fmt: skip
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
# Minimum versions accelerate checks features against (strings, for `compare_versions`).
FSDP_PYTORCH_VERSION = "2.1.0.a0+32f93b1"  # 2.1.0; MS-AMP's image ships this prerelease
FSDP2_PYTORCH_VERSION = "2.6.0"
DTENSOR_PYTORCH_VERSION = "2.5.0"
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"
