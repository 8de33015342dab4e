"""TransformerEngine fp8: layer conversion, the delayed-scaling recipe, and the fp8 autocast.

Usable alone: `convert_to_te(model)` swaps `nn.Linear` and `nn.LayerNorm` for TE's modules
(weights copied, parameter names unchanged), and `te_fp8_autocast(TERecipeKwargs())` is the
context to run their forward in.
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, TypeVar

import torch

from accel_precision._device_kinds import fp8_device
from accel_precision._kwargs import TERecipeKwargs

M = TypeVar("M", bound=torch.nn.Module)

TE_INSTALL = "pip install accel-precision[te]"


def import_te() -> ModuleType:
    """Import `transformer_engine.pytorch`, or raise an ImportError naming the install command."""
    try:
        import transformer_engine.pytorch as te
    except ImportError as err:
        raise ImportError(
            f"fp8 with fp8_backend='te' needs TransformerEngine, which is not installed ({err}). "
            f"Install it with `{TE_INSTALL}` (CUDA only), or choose fp8_backend='ao'."
        ) from None
    return te


def te_recipe(kwargs: TERecipeKwargs | None = None) -> Any:
    """TE's `DelayedScaling` recipe built from `kwargs` (`MXFP8BlockScaling` when
    `use_mxfp8_block_scaling`)."""
    kw = kwargs or TERecipeKwargs()
    import_te()
    from transformer_engine.common import recipe

    if kw.use_mxfp8_block_scaling:
        return _mxfp8_recipe(kw, recipe)
    args: dict[str, Any] = {
        "margin": kw.margin,
        "fp8_format": getattr(recipe.Format, kw.fp8_format),
        "amax_history_len": kw.amax_history_len,
        "amax_compute_algo": kw.amax_compute_algo,
    }
    params = inspect.signature(recipe.DelayedScaling).parameters
    if kw.override_linear_precision != (False, False, False):
        if "override_linear_precision" not in params:
            raise ValueError(
                f"TERecipeKwargs.override_linear_precision={kw.override_linear_precision}: this "
                f"TransformerEngine version has no such setting; leave it (False, False, False)."
            )
        args["override_linear_precision"] = recipe._OverrideLinearPrecision(
            *kw.override_linear_precision
        )
    if "interval" in params:
        args["interval"] = kw.interval
    elif kw.interval != 1:
        warnings.warn(
            f"TERecipeKwargs.interval={kw.interval} is ignored: this TransformerEngine version "
            f"recomputes the fp8 scale every step.",
            stacklevel=2,
        )
    return recipe.DelayedScaling(**args)


# The delayed-scaling settings MXFP8 block scaling has no use for, at their defaults.
_DELAYED_ONLY = {
    "interval": 1,
    "amax_history_len": 1024,
    "amax_compute_algo": "max",
    "override_linear_precision": (False, False, False),
}


def _mxfp8_recipe(kw: TERecipeKwargs, recipe: ModuleType) -> Any:
    """TE's `MXFP8BlockScaling`, where this TE and GPU have it (as accelerate builds it)."""
    flag = "TERecipeKwargs.use_mxfp8_block_scaling=True"
    if not hasattr(recipe, "MXFP8BlockScaling"):
        raise ValueError(
            f"{flag}: this TransformerEngine version has no MXFP8BlockScaling recipe; upgrade "
            f"TransformerEngine, or leave it False for delayed scaling."
        )
    try:
        from transformer_engine.pytorch.fp8 import check_mxfp8_support
    except ImportError:  # a TE that moved the check: the recipe itself reports what is missing
        check_mxfp8_support = None
    if check_mxfp8_support is not None:
        available, reason = check_mxfp8_support()
        if not available:
            raise ValueError(
                f"{flag}: MXFP8 block scaling is not available here ({reason}); leave it False "
                f"for delayed scaling."
            )
    for name, default in _DELAYED_ONLY.items():
        if getattr(kw, name) != default:
            raise ValueError(
                f"TERecipeKwargs.{name}={getattr(kw, name)!r} belongs to delayed scaling, which "
                f"MXFP8 block scaling does not use; leave it at {default!r}, or set "
                f"use_mxfp8_block_scaling=False."
            )
    args: dict[str, Any] = {"fp8_format": getattr(recipe.Format, kw.fp8_format)}
    params = inspect.signature(recipe.MXFP8BlockScaling).parameters
    if "margin" in params:
        args["margin"] = kw.margin
    elif kw.margin != 0:
        raise ValueError(
            f"TERecipeKwargs.margin={kw.margin}: this TransformerEngine's MXFP8BlockScaling has "
            f"no margin; leave it 0."
        )
    return recipe.MXFP8BlockScaling(**args)


def te_fp8_autocast(
    kwargs: TERecipeKwargs | None = None, *, enabled: bool = True, recipe: Any = None
) -> AbstractContextManager[Any]:
    """TE's fp8 autocast context with the delayed-scaling recipe (new or old TE spelling).

    Pass `recipe` (from `te_recipe`) to reuse one recipe object across steps.
    """
    te = import_te()
    rec = recipe if recipe is not None else te_recipe(kwargs)
    if hasattr(te, "autocast"):
        return te.autocast(enabled=enabled, recipe=rec)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=rec)


def _te_device(t: torch.Tensor) -> torch.device:
    return fp8_device(t)


def _te_linear(te: ModuleType, old: torch.nn.Linear) -> torch.nn.Module:
    w = old.weight
    new = te.Linear(
        old.in_features,
        old.out_features,
        bias=old.bias is not None,
        params_dtype=w.dtype,
        device=_te_device(w),
    )
    with torch.no_grad():
        new.weight.copy_(w)
        if old.bias is not None:
            new.bias.copy_(old.bias)
    return new


def _te_layernorm(te: ModuleType, old: torch.nn.LayerNorm) -> torch.nn.Module:
    w = old.weight
    new = te.LayerNorm(
        old.normalized_shape[0], eps=old.eps, params_dtype=w.dtype, device=_te_device(w)
    )
    with torch.no_grad():
        new.weight.copy_(w)
        if old.bias is not None:
            new.bias.copy_(old.bias)
        else:
            new.bias.zero_()
            new.bias.requires_grad_(False)
    return new


def te_convertible(module: torch.nn.Module) -> bool:
    """Whether `convert_to_te` swaps this module.

    `nn.Linear` with in/out features divisible by 16 (TE's fp8 GEMM needs it), and
    `nn.LayerNorm` over one dimension with learnable weights.
    """
    if isinstance(module, torch.nn.Linear):
        return module.in_features % 16 == 0 and module.out_features % 16 == 0
    if isinstance(module, torch.nn.LayerNorm):
        return len(module.normalized_shape) == 1 and module.weight is not None
    return False


def convert_to_te(model: M) -> M:
    """Swap `nn.Linear` and `nn.LayerNorm` layers for TE's, in place, keeping their weights.

    The new layers live on CUDA with the old parameters' dtype and the same parameter names;
    their parameters are new tensors, so an optimizer built earlier must be rebound (see
    `rebind_optimizer`). A model that is itself a Linear or LayerNorm is returned converted.
    """
    te = import_te()
    if te_convertible(model):
        return _convert_one(te, model)
    for name, child in list(model.named_children()):
        if te_convertible(child):
            setattr(model, name, _convert_one(te, child))
        else:
            convert_to_te(child)
    return model


def _convert_one(te: ModuleType, module: Any) -> Any:
    if isinstance(module, torch.nn.Linear):
        return _te_linear(te, module)
    return _te_layernorm(te, module)


def has_te_layers(model: torch.nn.Module) -> bool:
    """Whether any layer of `model` is a TransformerEngine module (False when TE is absent)."""
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        return False
    kinds = tuple(k for k in (getattr(te, "Linear", None), getattr(te, "LayerNorm", None)) if k)
    return any(isinstance(m, kinds) for m in model.modules())
