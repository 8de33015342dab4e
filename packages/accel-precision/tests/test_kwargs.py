"""The configuration records validate their fields and are frozen."""

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
        (
            FP8RecipeKwargs,
            {"fp8_backend": "msamp"},
            "fp8_backend='msamp': expected one of 'auto', 'te', 'ao'",
        ),
        (FP8RecipeKwargs, {"te": AORecipeKwargs()}, "expected a TERecipeKwargs"),
    ],
)
def test_bad_fields_are_named(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_records_are_frozen_and_keyword_only():
    for cls in (AutocastKwargs, GradScalerKwargs, TERecipeKwargs, AORecipeKwargs, FP8RecipeKwargs):
        record = cls()
        field = dataclasses.fields(cls)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, getattr(record, field))
    with pytest.raises(TypeError):
        GradScalerKwargs(1024.0)


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
