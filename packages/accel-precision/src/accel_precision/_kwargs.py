"""Configuration records for precision, validated on creation.

Their fields come in accelerate's order, so positional arguments mean what they mean there, and
they may be assigned after creation as accelerate's can. accel's own fields follow accelerate's
and are keyword-only. The fp8 records fill a field left as None from accelerate's
`ACCELERATE_FP8_*` variable (see `accel_precision._environment`), else from the default.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from accel_precision import _environment as env

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


def _check_bool(owner: str, field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{field}={value!r}: expected True or False.")


def _or_env(value: Any, read: Callable[[str], Any], variable: str, default: Any) -> Any:
    """`value`, else the variable's value, else `default`."""
    if value is not None:
        return value
    found = read(variable)
    return default if found is None else found


def _one_of_two(owner: str, names: tuple[str, str], values: tuple[Any, Any]) -> Any:
    """accelerate's name and accel's name for one setting: either, or both when they agree."""
    (a, b), (x, y) = names, values
    if x is not None and y is not None and x != y:
        raise ValueError(
            f"{owner} got {a}={x!r} and {b}={y!r}; they are one setting ({a} is accelerate's "
            f"name, {b} accel's): pass one of them."
        )
    return x if x is not None else y


@dataclasses.dataclass
class AutocastKwargs:
    """Arguments for `torch.autocast` in the mixed modes.

    `enabled=False` turns autocast off for the whole run (the weights stay fp32 and no
    loss scaling happens through autocast); `cache_enabled=None` keeps torch's default
    (the cast-weight cache is on inside autocast regions).
    """

    enabled: bool = True
    cache_enabled: bool | None = None

    def __post_init__(self) -> None:
        _check_bool("AutocastKwargs", "enabled", self.enabled)
        if self.cache_enabled is not None and not isinstance(self.cache_enabled, bool):
            raise ValueError(
                f"AutocastKwargs.cache_enabled={self.cache_enabled!r}: expected True, False or None."
            )


@dataclasses.dataclass
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
        _check_bool(owner, "enabled", self.enabled)

    def to_torch(self) -> dict[str, object]:
        """The keyword arguments torch's scaler constructors take."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TERecipeKwargs:
    """TransformerEngine fp8: delayed scaling (`DelayedScaling`), or MXFP8 block scaling.

    `fp8_format` "HYBRID" uses e4m3 forward and e5m2 for gradients, "E4M3" uses e4m3 for both.
    `interval` (how often the scale is recomputed) is passed only to TE versions that still take
    it; newer ones recompute every step. `use_autocast_during_eval=False` (accel's name for it:
    `use_during_eval`) runs eval forwards (under `torch.no_grad` with the model in eval mode)
    outside fp8, as bf16. `override_linear_precision` (fprop, dgrad, wgrad) runs those GEMMs in
    higher precision. `use_mxfp8_block_scaling=True` uses TE's `MXFP8BlockScaling` recipe
    (Blackwell GPUs), which has no amax history. Defaults: margin 0, interval 1, "HYBRID",
    amax history 1024, amax algorithm "max" (what TE runs with when accelerate's record is left
    at its defaults), no overrides, no MXFP8.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None
    _: dataclasses.KW_ONLY
    use_during_eval: bool | None = None

    def __post_init__(self) -> None:
        owner = "TERecipeKwargs"
        during_eval = _one_of_two(
            owner,
            ("use_autocast_during_eval", "use_during_eval"),
            (self.use_autocast_during_eval, self.use_during_eval),
        )
        during_eval = _or_env(
            during_eval, env.fp8_env_flag, env.ENV_FP8_USE_AUTOCAST_DURING_EVAL, False
        )
        _check_bool(owner, "use_autocast_during_eval", during_eval)
        self.use_autocast_during_eval = self.use_during_eval = during_eval
        self.margin = _or_env(self.margin, env.fp8_env_int, env.ENV_FP8_MARGIN, 0)
        _check_int(owner, "margin", self.margin, 0)
        self.interval = _or_env(self.interval, env.fp8_env_int, env.ENV_FP8_INTERVAL, 1)
        _check_int(owner, "interval", self.interval, 1)
        fmt = _or_env(self.fp8_format, env.fp8_env, env.ENV_FP8_FORMAT, "HYBRID")
        fmt = fmt.upper() if isinstance(fmt, str) else fmt
        _check_choice(owner, "fp8_format", fmt, TE_FP8_FORMATS)
        self.fp8_format = fmt
        self.amax_history_len = _or_env(
            self.amax_history_len, env.fp8_env_int, env.ENV_FP8_AMAX_HISTORY_LEN, 1024
        )
        _check_int(owner, "amax_history_len", self.amax_history_len, 1)
        algo = _or_env(self.amax_compute_algo, env.fp8_env, env.ENV_FP8_AMAX_COMPUTE_ALGO, "max")
        algo = algo.lower() if isinstance(algo, str) else algo
        _check_choice(owner, "amax_compute_algo", algo, TE_AMAX_ALGOS)
        self.amax_compute_algo = algo
        olp = self.override_linear_precision
        if olp is None:
            variables = (env.ENV_FP8_OVERRIDE_FPROP, env.ENV_FP8_OVERRIDE_DGRAD)
            olp = tuple(bool(env.fp8_env_flag(v)) for v in (*variables, env.ENV_FP8_OVERRIDE_WGRAD))
        olp = tuple(olp) if isinstance(olp, (tuple, list)) else (olp,)
        if len(olp) != 3 or not all(isinstance(v, bool) for v in olp):
            raise ValueError(
                f"{owner}.override_linear_precision={self.override_linear_precision!r}: expected "
                f"three bools (fprop, dgrad, wgrad)."
            )
        self.override_linear_precision = olp  # type: ignore[assignment]
        self.use_mxfp8_block_scaling = _or_env(
            self.use_mxfp8_block_scaling,
            env.fp8_env_flag,
            env.ENV_FP8_USE_MXFP8_BLOCK_SCALING,
            False,
        )
        _check_bool(owner, "use_mxfp8_block_scaling", self.use_mxfp8_block_scaling)


ModuleFilter = Callable[[torch.nn.Module, str], bool]


@dataclasses.dataclass
class AORecipeKwargs:
    """torchao float8 training (`torchao.float8.convert_to_float8_training`).

    `config` is torchao's `Float8LinearConfig`; when given it is used as it is (its
    `pad_inner_dim`, `enable_fsdp_float8_all_gather` and `emulate` are this record's too).
    Otherwise one is made from `recipe` ("tensorwise", the default, or "rowwise"),
    `pad_inner_dim` (default True, as accelerate's: GEMM dimensions padded to 16) and
    `enable_fsdp_float8_all_gather` (FSDP2 gathers fp8 weights, tensorwise only). The latter
    defaults to False where accelerate's defaults to True: the numbers are the same either
    way, and outside FSDP2 it only swaps each converted weight for torchao's wrapper tensor,
    which safetensors cannot save. Set it (or ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER)
    for FSDP2 runs.

    Which `nn.Linear` layers are converted: `module_filter_func(module, fqn) -> bool`
    (accelerate's) decides alone when given. Otherwise accel's rules: not the first and last
    ones when `skip_first_last` (embedding-side and output-head GEMMs are the most sensitive to
    fp8), not one whose in/out features are not divisible by 16 (an fp8 GEMM requirement), not
    one with fewer than `min_features` on either side (too small to gain; see
    `AO_MIN_FEATURES`). `module_filter_fn` (accel's) is asked as well, on top of either.
    `emulate=True` runs the fp8 math in higher precision on any device (for tests and
    debugging, never faster).
    """

    config: Any = None
    module_filter_func: ModuleFilter | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None
    _: dataclasses.KW_ONLY
    recipe: str | None = None
    skip_first_last: bool = True
    min_features: int = AO_MIN_FEATURES
    module_filter_fn: ModuleFilter | None = None
    emulate: bool | None = None

    def __post_init__(self) -> None:
        owner = "AORecipeKwargs"
        for name in ("module_filter_func", "module_filter_fn"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(
                    f"{owner}.{name}={value!r}: expected a callable (module, fqn) -> bool, or None."
                )
        if self.config is not None:
            self._take_from_config(owner)
        else:
            self.recipe = "tensorwise" if self.recipe is None else self.recipe
            _check_choice(owner, "recipe", self.recipe, AO_RECIPES)
            self.pad_inner_dim = _or_env(
                self.pad_inner_dim, env.fp8_env_flag, env.ENV_FP8_PAD_INNER_DIM, True
            )
            self.enable_fsdp_float8_all_gather = _or_env(
                self.enable_fsdp_float8_all_gather,
                env.fp8_env_flag,
                env.ENV_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER,
                False,
            )
            self.emulate = False if self.emulate is None else self.emulate
        _check_int(owner, "min_features", self.min_features, 0)
        for name in (
            "skip_first_last",
            "pad_inner_dim",
            "enable_fsdp_float8_all_gather",
            "emulate",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{owner}.{name}={value!r}: expected a bool.")
        if self.recipe == "rowwise" and self.enable_fsdp_float8_all_gather:
            raise ValueError(
                f"{owner}: enable_fsdp_float8_all_gather=True works only with recipe='tensorwise' "
                f"(got recipe='rowwise'); turn one of them off (it may come from "
                f"{env.ENV_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER})."
            )

    def _take_from_config(self, owner: str) -> None:
        """`config` decides the recipe; the fields that repeat it must agree with it."""
        shared = ("pad_inner_dim", "enable_fsdp_float8_all_gather", "emulate")
        missing = [name for name in shared if not hasattr(self.config, name)]
        if missing:
            raise ValueError(
                f"{owner}.config={self.config!r}: expected a torchao.float8.Float8LinearConfig "
                f"(it has no {missing}), or None."
            )
        if self.recipe is not None:
            raise ValueError(
                f"{owner}: recipe={self.recipe!r} and config= both choose the recipe; pass "
                f"config=Float8LinearConfig.from_recipe_name({self.recipe!r}) or recipe alone."
            )
        for name in shared:
            mine, theirs = getattr(self, name), getattr(self.config, name)
            if mine is None:
                setattr(self, name, theirs)
            elif mine != theirs:
                raise ValueError(
                    f"{owner}.{name}={mine!r} disagrees with config.{name}={theirs!r}; set it in "
                    f"the Float8LinearConfig, or leave {name} unset."
                )


# accelerate's (deprecated) FP8RecipeKwargs fields that are TERecipeKwargs fields.
_TE_RECORD_FIELDS = (
    "use_autocast_during_eval",
    "margin",
    "interval",
    "fp8_format",
    "amax_history_len",
    "amax_compute_algo",
    "override_linear_precision",
    "use_mxfp8_block_scaling",
)


@dataclasses.dataclass
class FP8RecipeKwargs:
    """fp8 training: which backend, and each backend's settings.

    accel's form is keyword-only: `fp8_backend` "te" is TransformerEngine, "ao" torchao float8,
    "auto" (the default) the first installed of the two (TE first); `te` and `ao` are each
    backend's record, and only the chosen backend's is used.

    accelerate's deprecated form is accepted too, positionally in its order: `opt_level`
    (MS-AMP's; only "O2", which asks nothing of TE), the `TERecipeKwargs` fields, and
    `backend` ("TE"; "MSAMP" is refused: accel does not support MS-AMP). It warns with
    accelerate's FutureWarning, builds `te` from those fields, and leaves them readable here.
    """

    opt_level: str | None = None
    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None
    backend: str | None = None
    _: dataclasses.KW_ONLY
    fp8_backend: str | None = None
    te: TERecipeKwargs | None = None
    ao: AORecipeKwargs | None = None

    def __post_init__(self) -> None:
        owner = "FP8RecipeKwargs"
        te_given = {k: getattr(self, k) for k in _TE_RECORD_FIELDS if getattr(self, k) is not None}
        accelerate_form = bool(te_given) or self.opt_level is not None or self.backend is not None
        if accelerate_form and self.te is None:  # (a copy made by dataclasses.replace has te)
            warnings.warn(
                "FP8RecipeKwargs(opt_level=..., margin=..., backend=...) is accelerate's "
                "deprecated form (to be removed in accelerate 2.0); use TERecipeKwargs(...) or "
                "AORecipeKwargs(...) instead.",
                FutureWarning,
                stacklevel=3,
            )
        self.fp8_backend = self._resolve_backend(owner)
        opt_level = _or_env(self.opt_level, env.fp8_env, env.ENV_FP8_OPT_LEVEL, "O2")
        opt_level = opt_level.upper() if isinstance(opt_level, str) else opt_level
        if opt_level != "O2":
            raise ValueError(
                f"{owner}.opt_level={opt_level!r}: optimization levels are MS-AMP's, which accel "
                f"does not support; leave it at 'O2' (or unset) and use TransformerEngine or torchao."
            )
        self.opt_level = opt_level
        if self.te is None:
            self.te = TERecipeKwargs(**te_given)
        if not isinstance(self.te, TERecipeKwargs):
            raise ValueError(f"{owner}.te={self.te!r}: expected a TERecipeKwargs.")
        clash = sorted(k for k, v in te_given.items() if getattr(self.te, k) != v)
        if clash:
            raise ValueError(
                f"{owner} got te= and also {clash}, which differ from it; set them in the "
                f"TERecipeKwargs."
            )
        for name in _TE_RECORD_FIELDS:
            setattr(self, name, getattr(self.te, name))
        self.ao = AORecipeKwargs() if self.ao is None else self.ao
        if not isinstance(self.ao, AORecipeKwargs):
            raise ValueError(f"{owner}.ao={self.ao!r}: expected an AORecipeKwargs.")
        self.backend = self.fp8_backend.upper() if self.fp8_backend != "auto" else None

    def _resolve_backend(self, owner: str) -> str:
        """accel's `fp8_backend`, accelerate's `backend` (or ACCELERATE_FP8_BACKEND), lower-cased."""
        names = ("backend", "fp8_backend")
        backend = _one_of_two(owner, names, (_lower(self.backend), _lower(self.fp8_backend)))
        where = "backend" if self.backend is not None else "fp8_backend"
        if backend is None:
            backend, where = _lower(env.fp8_env(env.ENV_FP8_BACKEND)), env.ENV_FP8_BACKEND
        if backend is None:
            return "auto"
        if backend == "msamp":
            raise ValueError(
                f"{owner}: {where}='MSAMP' (MS-AMP) is not supported by accel; use 'TE' "
                f"(TransformerEngine) or 'AO' (torchao), e.g. TERecipeKwargs() or AORecipeKwargs()."
            )
        _check_choice(owner, where, backend, FP8_BACKENDS)
        return backend

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
                env.as_flag(v) for v in te["override_linear_precision"]
            )
        if "use_during_eval" in te:
            te["use_during_eval"] = env.as_flag(te["use_during_eval"])
        ao = {
            key: env.as_flag(section[key])
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


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


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
