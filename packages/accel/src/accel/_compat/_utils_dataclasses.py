"""accelerate.utils.dataclasses' enums, the kwargs-handler base, and the class lookup by name
that its plugins use."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from torch import nn

from accel_bigmodel import CustomDtype  # noqa: F401  (accelerate's path)


class EnumWithContains(enum.EnumMeta):
    """Enum metaclass whose `in` accepts values: `"fp16" in PrecisionLike` is True."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum whose `str()` is its value; `list()` gives every value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [str(member) for member in cls]


class SageMakerDistributedType(str, enum.Enum):
    """The `distributed_type` of a SageMaker config file: NO, DATA_PARALLEL (SageMaker's data
    parallelism) or MODEL_PARALLEL. accel reads these files; it does not launch SageMaker jobs."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(str, enum.Enum):
    """The library that runs fp8: none, TransformerEngine, MS-AMP or torchao."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class DynamoBackend(str, enum.Enum):
    """The `torch.compile` backends a config file may name."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"


class KwargsHandler:
    """Base of the dataclasses passed in `kwargs_handlers`: `to_kwargs()` gives the fields
    that differ from their defaults."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_kwargs(self) -> dict[str, Any]:
        default = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class of the first submodule of `module` (itself included, depth first) whose class
    is called `name`; None when there is none."""
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    return None
