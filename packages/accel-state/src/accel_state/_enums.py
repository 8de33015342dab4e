"""Enumerations shared by the whole workspace."""

from __future__ import annotations

import enum


class _StrEnum(str, enum.Enum):
    """A str-valued enum whose members compare equal to their values."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [m.value for m in cls]


class DistributedType(_StrEnum):
    """How the processes of a run cooperate."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"  # named for accelerate's scripts; accel runs no Megatron-LM


class PrecisionType(_StrEnum):
    """The mixed-precision names accepted across the workspace."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    FP16_TRUE = "fp16-true"
    BF16_TRUE = "bf16-true"


class RNGType(_StrEnum):
    """Random number generators that can be seeded, synchronized and checkpointed."""

    PYTHON = "python"
    NUMPY = "numpy"
    TORCH = "torch"
    CUDA = "cuda"
    GENERATOR = "generator"
    # the generator of another accelerator's device, synchronized like CUDA's
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    XLA = "xla"  # XLA's generator: seeded by set_seed on XLA; synchronizing it is refused


class ReduceOp(_StrEnum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"


class LoggerType(_StrEnum):
    ALL = "all"
    JSONL = "jsonl"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    COMETML = "comet_ml"
    AIM = "aim"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


# The device types torch knows besides cpu, mapped to the distributed type of a multi-process run.
MULTI_DEVICE_TYPES: dict[str, DistributedType] = {
    "cuda": DistributedType.MULTI_GPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "mlu": DistributedType.MULTI_MLU,
    "musa": DistributedType.MULTI_MUSA,
    "hpu": DistributedType.MULTI_HPU,
    "sdaa": DistributedType.MULTI_SDAA,
    "neuron": DistributedType.MULTI_NEURON,
    "cpu": DistributedType.MULTI_CPU,
}
