"""The precision modes, and `make_precision`, which picks one from its name."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import torch

from accel_precision._forward import wrap_forward
from accel_precision._fp8 import check_fp8_support, resolve_fp8_backend
from accel_precision._fp8_ao import convert_to_ao_float8, import_torchao_float8
from accel_precision._fp8_te import convert_to_te, te_fp8_autocast, te_recipe
from accel_precision._kwargs import (
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
)
from accel_precision._precision import Precision

M = TypeVar("M", bound=torch.nn.Module)

PRECISION_MODES = ("no", "fp16", "bf16", "fp8", "fp16-true", "bf16-true")
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


class MixedPrecision(Precision):
    """fp16 or bf16 autocast over fp32 weights; fp16 adds a loss scaler.

    `sharded=True` makes the scaler FSDP's ShardedGradScaler, which agrees on inf/nan across
    ranks (for FSDP and other sharded strategies; it needs a process group at `unscale_`).
    """

    def __init__(
        self,
        half: str,
        *,
        device_type: str = "cpu",
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        sharded: bool = False,
    ) -> None:
        assert half in _HALF, half
        super().__init__(device_type=device_type)
        self.name = half
        self._dtype = _HALF[half]
        self.autocast_kwargs = autocast_kwargs or AutocastKwargs()
        if half == "fp16":
            kw = (scaler_kwargs or GradScalerKwargs()).to_torch()
            if sharded:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                self._scaler = ShardedGradScaler(device=device_type, **kw)
            else:
                self._scaler = torch.amp.GradScaler(device_type, **kw)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def autocast(self, enabled: bool = True) -> AbstractContextManager[Any]:
        if not self.autocast_kwargs.enabled:
            return contextlib.nullcontext()
        return torch.autocast(
            self.device_type,
            dtype=self._dtype,
            enabled=enabled,
            cache_enabled=self.autocast_kwargs.cache_enabled,
        )

    def wrap_forward(self, model: M) -> M:
        """Run the forward under autocast and return its fp16/bf16 outputs as fp32."""
        return wrap_forward(model, context=self.autocast)


class HalfPrecision(Precision):
    """True half precision ("fp16-true", "bf16-true"): the weights themselves are half.

    No fp32 master copy and no loss scaler, so there is nothing to unscale (this avoids
    "Attempting to unscale FP16 gradients"); fp16-true can underflow small gradients, and
    Adam's default eps=1e-8 rounds to 0 in fp16 (use eps >= 1e-4 there, or bf16-true).
    """

    def __init__(self, half: str, *, device_type: str = "cpu") -> None:
        assert half in _HALF, half
        super().__init__(device_type=device_type)
        self.name = f"{half}-true"
        self._dtype = _HALF[half]

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def _convert(self, model: M) -> M:
        return model.to(dtype=self._dtype)

    def wrap_forward(self, model: M) -> M:
        """Cast floating inputs to the half dtype and return outputs as fp32."""
        return wrap_forward(model, input_dtype=self._dtype)


class FP8Precision(MixedPrecision):
    """fp8 matmuls (TransformerEngine or torchao float8) under bf16 autocast for the rest.

    Made only where fp8 can run: a CUDA GPU of capability >= 8.9, unless torchao's emulation
    is asked for. `convert_module` swaps the layers; `autocast` adds TE's fp8 autocast.
    """

    def __init__(
        self,
        *,
        device_type: str = "cuda",
        autocast_kwargs: AutocastKwargs | None = None,
        fp8_kwargs: FP8RecipeKwargs | TERecipeKwargs | AORecipeKwargs | None = None,
    ) -> None:
        super().__init__("bf16", device_type=device_type, autocast_kwargs=autocast_kwargs)
        self.name = "fp8"
        self.fp8_kwargs = FP8RecipeKwargs.coerce(fp8_kwargs)
        self.backend = resolve_fp8_backend(self.fp8_kwargs)
        self._te_recipe: Any = None
        if self.backend == "te":
            check_fp8_support(device_type)
            self._te_recipe = te_recipe(self.fp8_kwargs.te)  # fails early when TE is missing
        else:
            import_torchao_float8()
            if not self.fp8_kwargs.ao.emulate:
                check_fp8_support(device_type)

    def __repr__(self) -> str:
        return f"FP8Precision(backend={self.backend!r}, device_type={self.device_type!r})"

    def autocast(self, enabled: bool = True) -> AbstractContextManager[Any]:
        if self.backend == "ao":
            return super().autocast(enabled)
        return self._te_autocast(enabled)

    @contextlib.contextmanager
    def _te_autocast(self, enabled: bool) -> Iterator[None]:
        with super().autocast(enabled), te_fp8_autocast(enabled=enabled, recipe=self._te_recipe):
            yield

    def _convert(self, model: M) -> M:
        if self.backend == "te":
            return convert_to_te(model)
        return convert_to_ao_float8(model, self.fp8_kwargs.ao)

    def wrap_forward(self, model: M) -> M:
        """bf16 autocast (plus TE's fp8 autocast, in training or when asked for eval), fp32 outputs."""
        if self.backend == "ao" or self.fp8_kwargs.te.use_during_eval:
            return wrap_forward(model, context=self.autocast)

        def context() -> AbstractContextManager[Any]:
            if model.training:
                return self.autocast()
            return MixedPrecision.autocast(self)

        return wrap_forward(model, context=context)


def _device_type(device_type: str) -> str:
    try:
        ok = torch.amp.is_autocast_available(device_type)
    except RuntimeError:
        ok = False
    if not isinstance(device_type, str) or ":" in device_type or not ok:
        raise ValueError(
            f"device_type={device_type!r}: expected a device type torch can autocast on, such as "
            f"'cuda', 'cpu', 'xpu', 'mps' or 'hpu' (no index: 'cuda', not 'cuda:0')."
        )
    return device_type


def make_precision(
    mode: str = "no",
    *,
    device_type: str = "cpu",
    autocast_kwargs: AutocastKwargs | None = None,
    scaler_kwargs: GradScalerKwargs | None = None,
    fp8_kwargs: FP8RecipeKwargs | TERecipeKwargs | AORecipeKwargs | None = None,
    sharded: bool = False,
) -> Precision:
    """The precision object for `mode`, one of "no", "fp16", "bf16", "fp8", "fp16-true", "bf16-true".

    `device_type` is where the model runs ("cuda", "cpu", ...). Kwargs records that do not apply
    to the mode are ignored with a warning. `sharded=True` (set by sharded strategies such as
    FSDP) gives fp16 a ShardedGradScaler; it changes nothing in other modes. fp8 raises an
    ImportError when its library is missing and a RuntimeError on a device without fp8.
    """
    name = str(getattr(mode, "value", mode)).lower()
    if name not in PRECISION_MODES:
        raise ValueError(
            f"mixed precision mode {mode!r} is not known; expected one of "
            f"{', '.join(map(repr, PRECISION_MODES))}."
        )
    device_type = _device_type(device_type)
    _warn_unused(name, scaler_kwargs=scaler_kwargs, fp8_kwargs=fp8_kwargs)
    if name == "no":
        return Precision(device_type=device_type)
    if name in ("fp16", "bf16"):
        return MixedPrecision(
            name,
            device_type=device_type,
            autocast_kwargs=autocast_kwargs,
            scaler_kwargs=scaler_kwargs,
            sharded=sharded,
        )
    if name == "fp8":
        return FP8Precision(
            device_type=device_type, autocast_kwargs=autocast_kwargs, fp8_kwargs=fp8_kwargs
        )
    return HalfPrecision(name.removesuffix("-true"), device_type=device_type)


def _warn_unused(name: str, **given: object) -> None:
    applies = {"scaler_kwargs": ("fp16",), "fp8_kwargs": ("fp8",)}
    for key, value in given.items():
        if value is not None and name not in applies[key]:
            warnings.warn(
                f"{key} apply to mixed precision {applies[key][0]!r} only; ignored for {name!r}.",
                stacklevel=3,
            )
