"""torchao float8 training: which linear layers to convert, and the conversion itself.

Usable alone: `convert_to_ao_float8(model, AORecipeKwargs(...))` swaps the chosen `nn.Linear`
layers for torchao's `Float8Linear` in place (weights kept) and returns the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import torch

from accel_precision._kwargs import AORecipeKwargs

M = TypeVar("M", bound=torch.nn.Module)

AO_INSTALL = "pip install accel-precision[ao]"


def import_torchao_float8() -> ModuleType:
    """Import `torchao.float8`, or raise an ImportError naming the install command."""
    try:
        import torchao.float8 as float8
    except ImportError as err:
        raise ImportError(
            f"fp8 with fp8_backend='ao' needs torchao, which is not installed ({err}). "
            f"Install it with `{AO_INSTALL}`, or choose fp8_backend='te'."
        ) from None
    return float8


def _linear_names(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """The qualified names of the first and last `nn.Linear` of `model`, in registration order
    (None, None when it has none): what `skip_first_last` keeps in high precision."""
    names = _linear_names(model)
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether torchao may convert `module` (named `fqn`) to fp8: not a `nn.Linear` whose
    in/out features are not both divisible by 16, and not one of `layers_to_filter`
    (accelerate's `accelerate.utils.ao` function)."""
    if isinstance(module, torch.nn.Linear) and (
        module.in_features % 16 or module.out_features % 16
    ):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """`filter_linear_layers` that keeps the first and last linear layers of `module` out."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, [n for n in (first, last) if n is not None])


def ao_float8_filter(
    model: torch.nn.Module, kwargs: AORecipeKwargs | None = None
) -> Callable[[torch.nn.Module, str], bool]:
    """The `(module, fqn) -> bool` filter that decides which layers of `model` are converted.

    Only `nn.Linear` layers. `module_filter_func` (accelerate's), when given, decides alone
    among them. Otherwise the rules of `AORecipeKwargs`: not the first and last linear layers
    when `skip_first_last` (first and last in registration order, the order `named_modules`
    lists them, which is the forward order in the usual embed -> blocks -> head models); both
    in and out features divisible by 16; both at least `min_features`. `module_filter_fn`
    (accel's) must agree as well when one is given.
    """
    kw = kwargs or AORecipeKwargs()
    first, last = find_first_last_linear_layers(model)
    edges = {first, last} - {None} if kw.skip_first_last else set()

    def rules(module: torch.nn.Linear, fqn: str) -> bool:
        if fqn in edges:
            return False
        n_in, n_out = module.in_features, module.out_features
        if n_in % 16 or n_out % 16:
            return False
        return min(n_in, n_out) >= kw.min_features

    def accept(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return False
        decide = kw.module_filter_func or rules
        if not decide(module, fqn):
            return False
        return kw.module_filter_fn is None or bool(kw.module_filter_fn(module, fqn))

    return accept


def ao_float8_config(kwargs: AORecipeKwargs | None = None) -> object:
    """torchao's `Float8LinearConfig` for these settings (`kwargs.config` itself when given)."""
    kw = kwargs or AORecipeKwargs()
    float8 = import_torchao_float8()
    if kw.config is not None:
        return kw.config
    if kw.recipe == "tensorwise":
        return float8.Float8LinearConfig(
            enable_fsdp_float8_all_gather=kw.enable_fsdp_float8_all_gather,
            pad_inner_dim=kw.pad_inner_dim,
            emulate=kw.emulate,
        )
    base = float8.Float8LinearConfig.from_recipe_name(kw.recipe)
    return dataclasses.replace(base, pad_inner_dim=kw.pad_inner_dim, emulate=kw.emulate)


def convert_to_ao_float8(model: M, kwargs: AORecipeKwargs | None = None) -> M:
    """Swap the layers `ao_float8_filter` accepts for torchao `Float8Linear`, in place.

    Returns the same model. Layers keep their parameters (the same tensors), so an optimizer
    built before or after the conversion trains them; with `enable_fsdp_float8_all_gather`
    torchao wraps each converted weight in a new parameter (`Precision.convert_module` then
    re-points the optimizers).
    """
    float8 = import_torchao_float8()
    config = ao_float8_config(kwargs)
    keep = ao_float8_filter(model, kwargs)
    out = float8.convert_to_float8_training(model, module_filter_fn=keep, config=config)
    assert out is model or isinstance(model, torch.nn.Linear)
    return out


def convert_model_to_fp8_ao(
    model: M,
    config: object | None = None,
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None,
) -> M:
    """accelerate's form of the conversion, in place: every `nn.Linear` whose features are
    divisible by 16, except the first and last linear layers; `module_filter_func` replaces
    that rule when given, and `config` is torchao's `Float8LinearConfig` (its default: None).
    No minimum size applies here (AORecipeKwargs.min_features is the Accelerator's rule)."""
    float8 = import_torchao_float8()
    keep = module_filter_func or ao_float8_filter(model, AORecipeKwargs(min_features=0))
    float8.convert_to_float8_training(model, module_filter_fn=keep, config=config)
    return model


def has_ao_float8_layers(model: torch.nn.Module) -> bool:
    """Whether any layer of `model` is a torchao `Float8Linear` (False when torchao is absent)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return False
    return any(isinstance(m, Float8Linear) for m in model.modules())
