"""Enums, the kwargs-handler base, and model helpers for the `accel.utils` paths."""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any

import torch
from torch import nn


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


class FP8BackendType(str, enum.Enum):
    """The library that runs fp8: none, TransformerEngine, MS-AMP or torchao."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class CustomDtype(str, enum.Enum):
    """Dtypes torch has no name for, used in `special_dtypes` of device maps."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


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


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> torch.amp.GradScaler:
    """A GradScaler for this machine's accelerator (CPU when there is none)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.amp.GradScaler(device, **kwargs)


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: Any = None
) -> Any:
    """torch.autocast for this machine's device when `native_amp`, else a null context."""
    import contextlib

    if not native_amp:
        return contextlib.nullcontext()
    from accel_state import PartialState

    state = PartialState()
    extra = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtype = (
        torch.float16 if os.environ.get("ACCELERATE_MIXED_PRECISION") == "fp16" else torch.bfloat16
    )
    return torch.autocast(device_type=state.device.type, dtype=dtype, **extra)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """True when `model`'s config asks for tied word embeddings (transformers models)."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False)) and hasattr(
        model, "get_output_embeddings"
    )


def load_offloaded_weights(
    model: nn.Module, index: dict[str, dict], offload_folder: str | os.PathLike
) -> None:
    """Load each weight listed in an offload `index` from `offload_folder` into `model`."""
    from accel_bigmodel import load_offloaded_weight, set_module_tensor_to_device

    for name, info in index.items():
        path = os.path.join(offload_folder, info.get("file", f"{name}.dat"))
        set_module_tensor_to_device(model, name, "cpu", value=load_offloaded_weight(path, info))


def is_peft_model(model: Any) -> bool:
    """True for a PEFT model (checked by class, without importing peft)."""
    return any(cls.__name__ == "PeftModel" for cls in type(model).__mro__)


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """tqdm's progress bar, shown only on the local main process when `main_process_only`."""
    from tqdm.auto import tqdm as bar

    if main_process_only:
        from accel_state import PartialState

        kwargs["disable"] = kwargs.get("disable", False) or not PartialState().is_local_main_process
    return bar(*args, **kwargs)
