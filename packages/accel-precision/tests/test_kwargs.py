"""The configuration records validate their fields, take accelerate's positional order and
spellings, and fill unset fp8 fields from accelerate's ACCELERATE_FP8_* variables."""

from __future__ import annotations

import dataclasses

import pytest

from accel_precision import (
    AORecipeKwargs,
    AutocastKwargs,
    FP8RecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
)


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (AutocastKwargs, {"enabled": "yes"}, "AutocastKwargs.enabled='yes'"),
        (AutocastKwargs, {"cache_enabled": 1}, "cache_enabled=1"),
        (GradScalerKwargs, {"init_scale": 0}, "init_scale=0"),
        (GradScalerKwargs, {"growth_factor": 1.0}, "growth_factor=1.0"),
        (
            GradScalerKwargs,
            {"backoff_factor": 1.5},
            r"backoff_factor=1.5: expected a number in \(0, 1\)",
        ),
        (GradScalerKwargs, {"growth_interval": 0}, "growth_interval=0"),
        (GradScalerKwargs, {"growth_interval": 2.5}, "growth_interval=2.5"),
        (TERecipeKwargs, {"margin": -1}, "margin=-1"),
        (TERecipeKwargs, {"interval": 0}, "interval=0"),
        (
            TERecipeKwargs,
            {"fp8_format": "E5M2"},
            "fp8_format='E5M2': expected one of 'HYBRID', 'E4M3'",
        ),
        (TERecipeKwargs, {"amax_history_len": 0}, "amax_history_len=0"),
        (TERecipeKwargs, {"amax_compute_algo": "mean"}, "amax_compute_algo='mean'"),
        (AORecipeKwargs, {"recipe": "blockwise"}, "recipe='blockwise'"),
        (AORecipeKwargs, {"min_features": -16}, "min_features=-16"),
        (AORecipeKwargs, {"module_filter_fn": 3}, "module_filter_fn=3"),
        (AORecipeKwargs, {"emulate": "no"}, "emulate='no'"),
        (
            AORecipeKwargs,
            {"recipe": "rowwise", "enable_fsdp_float8_all_gather": True},
            "tensorwise",
        ),
        (FP8RecipeKwargs, {"fp8_backend": "msamp"}, "MS-AMP.*not supported.*'TE'"),
        (
            FP8RecipeKwargs,
            {"fp8_backend": "deepspeed"},
            "fp8_backend='deepspeed': expected one of 'auto', 'te', 'ao'",
        ),
        (FP8RecipeKwargs, {"te": AORecipeKwargs()}, "expected a TERecipeKwargs"),
    ],
)
def test_bad_fields_are_named(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_records_take_accelerate_positional_order_and_may_be_assigned():
    assert AutocastKwargs(False, True) == AutocastKwargs(enabled=False, cache_enabled=True)
    assert GradScalerKwargs(1024.0, 3.0, 0.25, 10, False).to_torch() == {
        "init_scale": 1024.0,
        "growth_factor": 3.0,
        "backoff_factor": 0.25,
        "growth_interval": 10,
        "enabled": False,
    }
    te = TERecipeKwargs(True, 1, 2, "E4M3", 16, "most_recent", (True, False, False), False)
    assert (te.use_autocast_during_eval, te.margin, te.interval, te.fp8_format) == (
        True,
        1,
        2,
        "E4M3",
    )
    assert (te.amax_history_len, te.amax_compute_algo) == (16, "most_recent")
    assert te.override_linear_precision == (True, False, False)
    assert te.use_during_eval is True and te.use_mxfp8_block_scaling is False

    def keep(module, fqn):
        return True

    ao = AORecipeKwargs(None, keep, False, False)
    assert (ao.module_filter_func, ao.pad_inner_dim, ao.enable_fsdp_float8_all_gather) == (
        keep,
        False,
        False,
    )
    with pytest.raises(TypeError):  # accel's own fields are keyword-only
        AORecipeKwargs(None, None, None, None, "rowwise")
    for record in (AutocastKwargs(), GradScalerKwargs(), te, ao, FP8RecipeKwargs()):
        field = dataclasses.fields(record)[0].name
        setattr(record, field, getattr(record, field))  # mutable, as accelerate's are


def test_te_recipe_takes_accelerate_and_accel_names_for_eval_autocast():
    assert TERecipeKwargs(use_autocast_during_eval=True).use_during_eval is True
    assert TERecipeKwargs(use_during_eval=True).use_autocast_during_eval is True
    assert TERecipeKwargs().use_during_eval is False
    with pytest.raises(ValueError, match="use_autocast_during_eval=True and use_during_eval=False"):
        TERecipeKwargs(use_autocast_during_eval=True, use_during_eval=False)


def test_unset_fp8_fields_read_accelerate_variables(monkeypatch):
    for name, value in {
        "MARGIN": "3",
        "INTERVAL": "2",
        "FORMAT": "e4m3",
        "AMAX_HISTORY_LEN": "8",
        "AMAX_COMPUTE_ALGO": "MOST_RECENT",
        "USE_AUTOCAST_DURING_EVAL": "true",
        "OVERRIDE_DGRAD": "1",
        "PAD_INNER_DIM": "false",
        "ENABLE_FSDP_FLOAT8_ALL_GATHER": "true",
    }.items():
        monkeypatch.setenv(f"ACCELERATE_FP8_{name}", value)
    te = TERecipeKwargs(margin=5)  # given in code wins over the variable
    assert (te.margin, te.interval, te.fp8_format, te.amax_history_len) == (5, 2, "E4M3", 8)
    assert te.amax_compute_algo == "most_recent" and te.use_during_eval is True
    assert te.override_linear_precision == (False, True, False)
    ao = AORecipeKwargs()
    assert ao.pad_inner_dim is False and ao.enable_fsdp_float8_all_gather is True
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    assert FP8RecipeKwargs().fp8_backend == "te"
    monkeypatch.setenv("ACCELERATE_FP8_INTERVAL", "often")
    with pytest.raises(ValueError, match="ACCELERATE_FP8_INTERVAL='often': expected a whole"):
        TERecipeKwargs()


def test_defaults_without_variables():
    te = TERecipeKwargs()
    assert (te.margin, te.interval, te.fp8_format, te.amax_history_len) == (0, 1, "HYBRID", 1024)
    assert te.amax_compute_algo == "max" and te.override_linear_precision == (False,) * 3
    ao = AORecipeKwargs()
    assert (ao.recipe, ao.pad_inner_dim, ao.enable_fsdp_float8_all_gather, ao.emulate) == (
        "tensorwise",
        True,
        False,
        False,
    )


def test_accelerate_fp8_recipe_kwargs_form_maps_onto_te():
    with pytest.warns(FutureWarning, match="deprecated"):
        kw = FP8RecipeKwargs("O2", True, 1, 2, "E4M3", 16, "max", None, None, "TE")
    assert kw.fp8_backend == "te" and kw.backend == "TE"
    assert (kw.te.margin, kw.te.interval, kw.te.fp8_format, kw.te.amax_history_len) == (
        1,
        2,
        "E4M3",
        16,
    )
    assert kw.te.use_during_eval is True and kw.margin == 1 and kw.opt_level == "O2"
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="MS-AMP"):
        FP8RecipeKwargs(backend="MSAMP")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="opt_level='O1'.*MS-AMP"):
        FP8RecipeKwargs(opt_level="O1", backend="TE")
    with pytest.raises(ValueError, match=r"te= and also \['margin'\]"):
        FP8RecipeKwargs(margin=1, te=TERecipeKwargs())
    copy = dataclasses.replace(kw, fp8_backend="te")  # a copy re-runs the checks, quietly
    assert copy == kw
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match="backend='te' and fp8_backend"),
    ):
        FP8RecipeKwargs(backend="TE", fp8_backend="ao")


def test_ao_recipe_takes_a_torchao_config():
    float8 = pytest.importorskip("torchao.float8")
    config = float8.Float8LinearConfig(pad_inner_dim=True, emulate=True)
    ao = AORecipeKwargs(config=config)
    assert ao.config is config and ao.recipe is None
    assert (ao.pad_inner_dim, ao.emulate, ao.enable_fsdp_float8_all_gather) == (True, True, False)
    with pytest.raises(ValueError, match="pad_inner_dim=False disagrees with config"):
        AORecipeKwargs(config, pad_inner_dim=False)
    with pytest.raises(ValueError, match="recipe='rowwise' and config= both"):
        AORecipeKwargs(config, recipe="rowwise")
    with pytest.raises(ValueError, match="expected a torchao.float8.Float8LinearConfig"):
        AORecipeKwargs(config={"pad_inner_dim": True})


def test_defaults_and_normalisation():
    te = TERecipeKwargs(fp8_format="e4m3")
    assert te.fp8_format == "E4M3"
    assert TERecipeKwargs().fp8_format == "HYBRID"
    assert FP8RecipeKwargs(fp8_backend="TE").fp8_backend == "te"
    assert GradScalerKwargs().to_torch() == {
        "init_scale": 65536.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        "enabled": True,
    }


def test_fp8_kwargs_coerce_picks_the_backend_of_the_record():
    te = TERecipeKwargs(margin=2)
    ao = AORecipeKwargs(min_features=16)
    assert FP8RecipeKwargs.coerce(te) == FP8RecipeKwargs(fp8_backend="te", te=te)
    assert FP8RecipeKwargs.coerce(ao) == FP8RecipeKwargs(fp8_backend="ao", ao=ao)
    assert FP8RecipeKwargs.coerce(None) == FP8RecipeKwargs()
    whole = FP8RecipeKwargs(fp8_backend="ao")
    assert FP8RecipeKwargs.coerce(whole) is whole
    with pytest.raises(TypeError, match="fp8_kwargs=.*expected FP8RecipeKwargs"):
        FP8RecipeKwargs.coerce({"fp8_backend": "te"})


def test_fp8_kwargs_from_accelerate_fp8_config():
    from accel_precision import FP8RecipeKwargs

    kw = FP8RecipeKwargs.from_config(
        {
            "backend": "TE",
            "margin": 2,
            "interval": 3,
            "fp8_format": "E4M3",
            "amax_history_length": 16,
            "amax_compute_algorithm": "most_recent",
            "use_autocast_during_eval": True,
            "override_linear_precision": [False, "true", False],
            "optimization_level": "O2",
            "pad_inner_dim": "false",
            "enable_fsdp_float8_all_gather": True,
        }
    )
    assert kw.fp8_backend == "te"
    assert (kw.te.margin, kw.te.interval, kw.te.fp8_format) == (2, 3, "E4M3")
    assert (kw.te.amax_history_len, kw.te.amax_compute_algo) == (16, "most_recent")
    assert kw.te.use_during_eval is True
    assert kw.te.override_linear_precision == (False, True, False)
    assert kw.ao.pad_inner_dim is False and kw.ao.enable_fsdp_float8_all_gather is True
    assert FP8RecipeKwargs.from_config({}) == FP8RecipeKwargs()
    for bad, match in (
        ({"backend": "msamp"}, "MS-AMP"),
        ({"optimization_level": "O1"}, "MS-AMP"),
        ({"fp8_format": "E5M2"}, "fp8_format"),
        ({"marign": 1}, "unknown keys"),
    ):
        with pytest.raises(ValueError, match=match):
            FP8RecipeKwargs.from_config(bad)
