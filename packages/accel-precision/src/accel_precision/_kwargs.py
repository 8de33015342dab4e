"""Configuration records for precision: frozen, keyword-only, validated on creation.

None of them reads the environment; the umbrella builds them from its own configuration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

FP8_BACKENDS = ("auto", "te", "ao")
TE_FP8_FORMATS = ("HYBRID", "E4M3")
TE_AMAX_ALGOS = ("max", "most_recent")
AO_RECIPES = ("tensorwise", "rowwise")

# Below this many features on either side, a torchao float8 linear layer is usually slower than
# its bf16 twin: the per-tensor amax/scale/cast kernels cost more than the fp8 GEMM saves. The
# published tensorwise tables for H100 show a gain only once the GEMM is about 1024 wide or more
# (torchao/float8 README, "performance" section). Lower it for tests or for layers you measured.
AO_MIN_FEATURES = 1024


def _check_choice(owner: str, field: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"{owner}.{field}={value!r}: expected one of {', '.join(map(repr, choices))}."
        )


def _check_int(owner: str, field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{field}={value!r}: expected an integer >= {minimum}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutocastKwargs:
    """Arguments for `torch.autocast` in the mixed modes.

    `enabled=False` turns autocast off for the whole run (the weights stay fp32 and no
    loss scaling happens through autocast); `cache_enabled=None` keeps torch's default
    (the cast-weight cache is on inside autocast regions).
    """

    enabled: bool = True
    cache_enabled: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"AutocastKwargs.enabled={self.enabled!r}: expected True or False.")
        if self.cache_enabled is not None and not isinstance(self.cache_enabled, bool):
            raise ValueError(
                f"AutocastKwargs.cache_enabled={self.cache_enabled!r}: expected True, False or None."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class GradScalerKwargs:
    """Arguments for the fp16 loss scaler (`torch.amp.GradScaler` or FSDP's ShardedGradScaler).

    On an inf/nan gradient the step is skipped and the scale multiplied by `backoff_factor`;
    after `growth_interval` clean steps it is multiplied by `growth_factor`.
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self) -> None:
        owner = "GradScalerKwargs"
        if not isinstance(self.init_scale, (int, float)) or not self.init_scale > 0:
            raise ValueError(f"{owner}.init_scale={self.init_scale!r}: expected a number > 0.")
        if not isinstance(self.growth_factor, (int, float)) or not self.growth_factor > 1:
            raise ValueError(
                f"{owner}.growth_factor={self.growth_factor!r}: expected a number > 1."
            )
        if not isinstance(self.backoff_factor, (int, float)) or not 0 < self.backoff_factor < 1:
            raise ValueError(
                f"{owner}.backoff_factor={self.backoff_factor!r}: expected a number in (0, 1)."
            )
        _check_int(owner, "growth_interval", self.growth_interval, 1)
        if not isinstance(self.enabled, bool):
            raise ValueError(f"{owner}.enabled={self.enabled!r}: expected True or False.")

    def to_torch(self) -> dict[str, object]:
        """The keyword arguments torch's scaler constructors take."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TERecipeKwargs:
    """TransformerEngine fp8 with delayed scaling (`transformer_engine.common.recipe.DelayedScaling`).

    `fp8_format` "HYBRID" uses e4m3 forward and e5m2 for gradients, "E4M3" uses e4m3 for both.
    `interval` (how often the scale is recomputed) is passed only to TE versions that still take
    it; newer ones recompute every step. `use_during_eval=False` runs eval forwards (under
    `torch.no_grad` with the model in eval mode) outside fp8, as bf16.
    `override_linear_precision` (fprop, dgrad, wgrad) runs those GEMMs in higher precision.
    """

    margin: int = 0
    interval: int = 1
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    use_during_eval: bool = False
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)

    def __post_init__(self) -> None:
        owner = "TERecipeKwargs"
        _check_int(owner, "margin", self.margin, 0)
        _check_int(owner, "interval", self.interval, 1)
        fmt = self.fp8_format.upper() if isinstance(self.fp8_format, str) else self.fp8_format
        _check_choice(owner, "fp8_format", fmt, TE_FP8_FORMATS)
        object.__setattr__(self, "fp8_format", fmt)
        _check_int(owner, "amax_history_len", self.amax_history_len, 1)
        _check_choice(owner, "amax_compute_algo", self.amax_compute_algo, TE_AMAX_ALGOS)
        if not isinstance(self.use_during_eval, bool):
            raise ValueError(f"{owner}.use_during_eval={self.use_during_eval!r}: expected a bool.")
        olp = tuple(self.override_linear_precision)
        if len(olp) != 3 or not all(isinstance(v, bool) for v in olp):
            raise ValueError(
                f"{owner}.override_linear_precision={self.override_linear_precision!r}: expected "
                f"three bools (fprop, dgrad, wgrad)."
            )
        object.__setattr__(self, "override_linear_precision", olp)


ModuleFilter = Callable[[torch.nn.Module, str], bool]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AORecipeKwargs:
    """torchao float8 training (`torchao.float8.convert_to_float8_training`).

    Which `nn.Linear` layers are converted: not the first and last ones when
    `skip_first_last` (embedding-side and output-head GEMMs are the most sensitive to fp8),
    not one whose in/out features are not divisible by 16 (an fp8 GEMM requirement), not one
    with fewer than `min_features` on either side (too small to gain; see `AO_MIN_FEATURES`),
    and, when `module_filter_fn(module, fqn)` is given, only those it accepts as well.
    `emulate=True` runs the fp8 math in higher precision on any device (for tests and debugging,
    never faster).
    """

    recipe: str = "tensorwise"
    skip_first_last: bool = True
    min_features: int = AO_MIN_FEATURES
    module_filter_fn: ModuleFilter | None = None
    pad_inner_dim: bool = False
    enable_fsdp_float8_all_gather: bool = False
    emulate: bool = False

    def __post_init__(self) -> None:
        owner = "AORecipeKwargs"
        _check_choice(owner, "recipe", self.recipe, AO_RECIPES)
        _check_int(owner, "min_features", self.min_features, 0)
        if self.module_filter_fn is not None and not callable(self.module_filter_fn):
            raise ValueError(
                f"{owner}.module_filter_fn={self.module_filter_fn!r}: expected a callable "
                f"(module, fqn) -> bool, or None."
            )
        for name in (
            "skip_first_last",
            "pad_inner_dim",
            "enable_fsdp_float8_all_gather",
            "emulate",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name}={getattr(self, name)!r}: expected a bool.")
        if self.recipe == "rowwise" and self.enable_fsdp_float8_all_gather:
            raise ValueError(
                f"{owner}: enable_fsdp_float8_all_gather=True works only with recipe='tensorwise' "
                f"(got recipe='rowwise'); turn one of them off."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class FP8RecipeKwargs:
    """fp8 training: which backend, and each backend's settings.

    `fp8_backend` "te" is TransformerEngine, "ao" torchao float8, "auto" the first installed of
    the two (TE first). Only the chosen backend's record is used.
    """

    fp8_backend: str = "auto"
    te: TERecipeKwargs = dataclasses.field(default_factory=TERecipeKwargs)
    ao: AORecipeKwargs = dataclasses.field(default_factory=AORecipeKwargs)

    def __post_init__(self) -> None:
        backend = self.fp8_backend.lower() if isinstance(self.fp8_backend, str) else None
        _check_choice("FP8RecipeKwargs", "fp8_backend", backend or self.fp8_backend, FP8_BACKENDS)
        object.__setattr__(self, "fp8_backend", backend)
        if not isinstance(self.te, TERecipeKwargs):
            raise ValueError(f"FP8RecipeKwargs.te={self.te!r}: expected a TERecipeKwargs.")
        if not isinstance(self.ao, AORecipeKwargs):
            raise ValueError(f"FP8RecipeKwargs.ao={self.ao!r}: expected an AORecipeKwargs.")

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> FP8RecipeKwargs:
        """Build from accelerate's `fp8_config` keys (a config file's section, or what
        `accel launch --fp8_*` hands down). A value accel-precision cannot honour is an error
        naming the key."""
        unknown = set(section) - set(_FP8_CONFIG_KEYS)
        if unknown:
            raise ValueError(
                f"fp8_config has unknown keys {sorted(unknown)}; accepted: {list(_FP8_CONFIG_KEYS)}."
            )
        backend = str(section.get("backend") or "auto").lower()
        if backend == "msamp":
            raise ValueError(
                "fp8_config backend 'msamp': MS-AMP is not supported by accel-precision; use 'te' "
                "(TransformerEngine) or 'ao' (torchao)."
            )
        level = str(section.get("optimization_level") or "O2").upper()
        if level != "O2":
            raise ValueError(
                f"fp8_config optimization_level {level!r} is MS-AMP's, which accel-precision does "
                f"not support; leave it at 'O2' and use the 'te' or 'ao' backend."
            )
        te: dict[str, Any] = {}
        for key, field in _TE_FIELDS.items():
            if section.get(key) is not None:
                te[field] = section[key]
        if "override_linear_precision" in te:
            te["override_linear_precision"] = tuple(
                _as_bool(v) for v in te["override_linear_precision"]
            )
        if "use_during_eval" in te:
            te["use_during_eval"] = _as_bool(te["use_during_eval"])
        ao = {
            key: _as_bool(section[key])
            for key in ("pad_inner_dim", "enable_fsdp_float8_all_gather")
            if section.get(key) is not None
        }
        return cls(fp8_backend=backend, te=TERecipeKwargs(**te), ao=AORecipeKwargs(**ao))

    @classmethod
    def coerce(
        cls, value: FP8RecipeKwargs | TERecipeKwargs | AORecipeKwargs | None
    ) -> FP8RecipeKwargs:
        """Accept any of the three records (a backend's own record picks that backend)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, TERecipeKwargs):
            return cls(fp8_backend="te", te=value)
        if isinstance(value, AORecipeKwargs):
            return cls(fp8_backend="ao", ao=value)
        raise TypeError(
            f"fp8_kwargs={value!r}: expected FP8RecipeKwargs, TERecipeKwargs, AORecipeKwargs or None."
        )


# accelerate's fp8_config keys -> TERecipeKwargs fields (optimization_level is MS-AMP's; it
# is accepted at its default, which asks nothing of TE or torchao).
_TE_FIELDS = {
    "margin": "margin",
    "interval": "interval",
    "fp8_format": "fp8_format",
    "amax_history_length": "amax_history_len",
    "amax_compute_algorithm": "amax_compute_algo",
    "use_autocast_during_eval": "use_during_eval",
    "override_linear_precision": "override_linear_precision",
}
_FP8_CONFIG_KEYS = (
    "backend",
    *_TE_FIELDS,
    "optimization_level",
    "pad_inner_dim",
    "enable_fsdp_float8_all_gather",
)


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "y", "t", "on")
    return bool(value)
