"""The public API is declared once and does not change by accident."""

from __future__ import annotations

import subprocess
import sys

import accel_precision

EXPECTED = [
    "AO_MIN_FEATURES",
    "MIN_FP8_CAPABILITY",
    "PRECISION_MODES",
    "AORecipeKwargs",
    "AutocastKwargs",
    "FP8Precision",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "TERecipeKwargs",
    "ao_float8_filter",
    "check_fp8_support",
    "convert_model_to_fp8_ao",
    "convert_outputs_to_fp32",
    "convert_to_ao_float8",
    "convert_to_te",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_float8_layers",
    "has_te_layers",
    "has_wrapped_forward",
    "make_precision",
    "rebind_optimizer",
    "resolve_fp8_backend",
    "te_convertible",
    "te_fp8_autocast",
    "te_recipe",
    "unwrap_forward",
    "wrap_forward",
]


def test_all_is_the_expected_list():
    assert accel_precision.__all__ == EXPECTED
    assert len(set(EXPECTED)) == len(EXPECTED)


def test_every_public_name_resolves():
    for name in accel_precision.__all__:
        assert getattr(accel_precision, name) is not None, name


def test_import_does_nothing():
    code = (
        "import os, sys; before = dict(os.environ); import accel_precision, torch; "
        "assert dict(os.environ) == before, 'environment changed'; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torchao', 'transformer_engine')]; "
        "assert not bad, bad; "
        "assert not torch.cuda.is_initialized(), 'cuda initialized'; "
        "import torch.distributed as dist; "
        "assert not (dist.is_available() and dist.is_initialized()); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
