"""torch.compile for prepared models: `TorchDynamoPlugin` and the compile step of `prepare`.

The backend comes from the code (`Accelerator(dynamo_backend=...)` or `dynamo_plugin=`), else
from `accel launch --dynamo_*` (the `dynamo_config` section of the launch configuration),
else no compilation. Regional compilation compiles each repeated block (every child of an
`nn.ModuleList`) in place, so state-dict keys do not change; a model without repeated
blocks is compiled whole.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Mapping
from typing import Any

from torch import nn

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# accelerate's variables for the fields a TorchDynamoPlugin is not given (scripts and
# launchers written for accelerate set them): BACKEND, MODE, USE_FULLGRAPH, USE_DYNAMIC,
# USE_REGIONAL_COMPILATION.
ENV_DYNAMO_PREFIX = "ACCELERATE_DYNAMO_"
_UNSET_DEFAULTS: dict[str, Any] = {
    "backend": "no", "mode": None, "fullgraph": False, "dynamic": None, "options": None,
    "disable": False,
}  # fmt: skip


def _from_environment(field: str, parse: Any) -> Any:
    """The value of ACCELERATE_DYNAMO_<field> parsed, or None where it is not set."""
    import os

    raw = os.environ.get(ENV_DYNAMO_PREFIX + field)
    return None if raw in (None, "") else parse(raw)


def _name(value: Any) -> str:
    """'inductor' from 'INDUCTOR' or an enum member whose value is 'INDUCTOR'."""
    return str(getattr(value, "value", value)).strip().lower()


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "y", "t", "on")
    return bool(value)


@dataclasses.dataclass
class TorchDynamoPlugin:
    """How `prepare` compiles models with `torch.compile`.

    `backend` "no" leaves models uncompiled; any other name is a torch.compile backend
    ("inductor", "eager", "aot_eager", "cudagraphs", ...). `mode`, `fullgraph`, `dynamic` and
    `options` are torch.compile's; `disable=True` makes compilation a no-op;
    `use_regional_compilation` compiles repeated blocks instead of the whole model. A field
    left as None takes accelerate's ACCELERATE_DYNAMO_* variable where one is set (as
    accelerate's plugin does), else the default: backend "no", no fullgraph, no regions.
    The fields are accelerate's, in its order, and may be assigned after creation (a backend
    given as accelerate's `DynamoBackend` or in capitals is stored as its lower-case name).
    """

    backend: str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Mapping[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "backend" and value is not None:
            value = _name(value) or "no"
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        unset = {
            "backend": ("BACKEND", _name, "no"),
            "mode": ("MODE", str, None),
            "fullgraph": ("USE_FULLGRAPH", _flag, False),
            "dynamic": ("USE_DYNAMIC", _flag, None),
            "use_regional_compilation": ("USE_REGIONAL_COMPILATION", _flag, False),
        }
        for field, (variable, parse, default) in unset.items():
            if getattr(self, field) is None:
                value = _from_environment(variable, parse)
                setattr(self, field, default if value is None else value)
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"TorchDynamoPlugin.mode={self.mode!r}: expected one of {MODES}.")
        if self.mode is not None and self.options:
            raise ValueError("TorchDynamoPlugin: torch.compile takes mode or options, not both.")

    @property
    def enabled(self) -> bool:
        return self.backend != "no" and not self.disable

    def compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of torch.compile."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph}
        if self.options:
            kwargs["options"] = dict(self.options)
        elif self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from the defaults (regional compilation left out: it is not
        a torch.compile argument)."""
        out = {}
        for name, value in self.to_dict().items():
            default = _UNSET_DEFAULTS.get(name, value)
            if name == "mode" and value == "default":
                value = None
            if value != default:
                out[name] = value
        return out

    @classmethod
    def from_launch(cls, section: Mapping[str, Any]) -> TorchDynamoPlugin:
        """From accelerate's `dynamo_config` keys (what `accel launch --dynamo_*` hands down)."""
        return cls(
            backend=section.get("dynamo_backend") or "no",
            mode=section.get("dynamo_mode") or "default",
            fullgraph=_flag(section.get("dynamo_use_fullgraph", False)),
            dynamic=_flag(section.get("dynamo_use_dynamic", False)),
            use_regional_compilation=_flag(section.get("dynamo_use_regional_compilation", False)),
        )


def resolve_dynamo_plugin(
    backend: Any, plugin: TorchDynamoPlugin | None, launched: Mapping[str, Any]
) -> TorchDynamoPlugin:
    """The code's choice (with a warning when `accel launch` said otherwise), else the launch's."""
    if backend is not None and plugin is not None:
        raise ValueError(
            "Pass dynamo_backend or dynamo_plugin to the Accelerator, not both "
            "(TorchDynamoPlugin(backend=...) holds the backend)."
        )
    from_launch = TorchDynamoPlugin.from_launch(launched) if launched else None
    chosen = plugin or (TorchDynamoPlugin(backend=backend) if backend is not None else None)
    if chosen is None:
        chosen = from_launch or TorchDynamoPlugin()
    elif from_launch is not None and from_launch.backend != chosen.backend:
        warnings.warn(
            f"The code sets dynamo_backend={chosen.backend!r} but `accel launch` was configured "
            f"with dynamo_backend={from_launch.backend!r}; using the code's value.",
            stacklevel=3,
        )
    if chosen.enabled:
        _check_backend(chosen.backend)
    return chosen


def _check_backend(name: str) -> None:
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise ValueError(
            f"dynamo_backend={name!r} is not a torch.compile backend of this torch; available: "
            f"{', '.join(['no', *known])}."
        )


def compile_model(model: nn.Module, plugin: TorchDynamoPlugin, inner: nn.Module) -> nn.Module:
    """`model` compiled as `plugin` says (`inner` is the user's module under any wrapper).

    Regional: every child of each `nn.ModuleList` of `inner` is compiled in place and `model`
    is returned; without repeated blocks, or otherwise, `torch.compile(model)`.
    """
    if not plugin.enabled:
        return model
    import torch

    kwargs = plugin.compile_kwargs()
    if plugin.use_regional_compilation and compile_blocks(inner, **kwargs):
        return model
    return torch.compile(model, **kwargs)


def compile_blocks(module: nn.Module, **compile_kwargs: Any) -> bool:
    """Compile, in place, every block of each outermost `nn.ModuleList` of `module` (one graph
    per repeated block; parameter names unchanged). False when there is none."""
    blocks: dict[str, nn.Module] = {}
    for name, child in module.named_modules():
        if isinstance(child, nn.ModuleList) and not any(
            name.startswith(f"{outer}.") for outer in blocks
        ):
            blocks[name] = child
    for block_list in blocks.values():
        for block in block_list:
            block.compile(**compile_kwargs)
    return bool(blocks)


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """A twin of `module` whose repeated blocks (the children of an `nn.ModuleList` of one
    class) are `torch.compile`d one by one, so they share one compiled graph; a subtree without
    repeated blocks is compiled whole. `module` itself is left as it was; the twin shares its
    parameters and keeps it as `_orig_mod` (what unwrapping returns)."""
    twin = _twin(module, compile_kwargs)
    twin.__dict__.setdefault("_orig_mod", module)
    return twin


def compile_regions_in_place(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """`compile_regions` without a twin: each repeated block, and each subtree without repeated
    blocks, is compiled in place (`nn.Module.compile`), so that the hooks an engine adds later
    (FSDP2's, DeepSpeed's) still run around it. Returns `module`."""
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            compile_regions_in_place(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)
    return module


def is_repeated_blocks(module: nn.Module) -> bool:
    """True for a non-empty `nn.ModuleList` whose entries are all of its first entry's class
    (the blocks regional compilation compiles once and reuses)."""
    return (
        isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(isinstance(m, type(module[0])) for m in module)
    )


def has_repeated_blocks(module: nn.Module) -> bool:
    """True when `module` or any submodule is a block of repeated layers (`is_repeated_blocks`)."""
    return bool(module._modules) and any(is_repeated_blocks(m) for m in module.modules())


def _twin(module: nn.Module, compile_kwargs: dict[str, Any]) -> nn.Module:
    import torch

    if is_repeated_blocks(module):
        return nn.ModuleList(torch.compile(block, **compile_kwargs) for block in module)
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)
    twin = type(module).__new__(type(module))
    twin.__dict__.update(module.__dict__)
    for name, value in module.__dict__.items():  # methods bound to the original follow the twin
        if isinstance(value, types.MethodType) and value.__self__ is module:
            twin.__dict__[name] = types.MethodType(value.__func__, twin)
    twin._modules = {}
    for name, child in module.named_children():
        twin.add_module(name, _twin(child, compile_kwargs))
    return twin
