"""Fixed vocabularies of accelerate's command line that code imports by name.

Defined once here; `accel.commands.*` and `accel.utils.constants` re-export them.
"""

from __future__ import annotations

# The torch.compile backends the questionnaire offers after 'no', in accelerate's order.
DYNAMO_BACKENDS = [
    "EAGER",
    "AOT_EAGER",
    "INDUCTOR",
    "AOT_TS_NVFUSER",
    "NVPRIMS_NVFUSER",
    "CUDAGRAPHS",
    "OFI",
    "FX2TRT",
    "ONNXRT",
    "TENSORRT",
    "AOT_TORCHXLA_TRACE_ONCE",
    "TORHCHXLA_TRACE_ONCE",
    "TVM",
]
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
# How DeepSpeed's runner reaches the machines (`deepspeed_multinode_launcher`).
DEEPSPEED_MULTINODE_LAUNCHERS = [
    "pdsh",
    "standard",
    "openmpi",
    "mvapich",
    "mpich",
    "nossh",
    "slurm",
]
# The state-dict types FSDP2 offers (FSDP1 also had LOCAL_STATE_DICT).
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
# SageMaker is not launched by accel; these are the defaults its config dataclass records.
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]
