"""The familiar classes take accelerate's arguments: every parameter of accelerate's constructor
exists in accel's, the positional ones in the same places, and positional construction in
accelerate's order gives the same field values (compared with accelerate's own objects where
accelerate can build them here). Then a few behaviours of accelerate's spellings."""

from __future__ import annotations

import datetime
import enum
import inspect
import warnings
from typing import Any

import pytest
from torch import nn

import accel
import accel.utils as familiar

_DDP = (1, False, 50, True, True, True, True, "power_sgd", "bf16", {})
# accelerate's classes and, for each, arguments in accelerate's positional order.
_CASES: dict[str, tuple[Any, ...]] = {
    "TorchTensorParallelPlugin": (2, None),
    "GradientAccumulationPlugin": (2, False, False, True),
    "DataLoaderConfiguration": (True, False, False, True, 7, True, False),
    "ProjectConfiguration": ("out", "logs", True, 3, 2, True),
    "DistributedDataParallelKwargs": _DDP,
    "GradScalerKwargs": (1024.0, 3.0, 0.25, 10, False),
    "InitProcessGroupKwargs": ("gloo", "tcp://127.0.0.1:29500", datetime.timedelta(seconds=5)),
    "AutocastKwargs": (False, True),
    "ProfileKwargs": (["cpu"], {"wait": 1, "active": 2}, None, True, True, True, True, True, "tr"),
    "TorchDynamoPlugin": ("inductor", "max-autotune", True, True, None, True, True),
    "TERecipeKwargs": (True, 1, 2, "E4M3", 16, "most_recent", (True, False, False), False),
    "AORecipeKwargs": (None, len, False, True),
    "TorchContextParallelConfig": ("alltoall",),
    "FP8RecipeKwargs": ("O2", True, 1, 2, "E4M3", 16, "max", (False, True, False), False, "TE"),
}
# Fields whose value differs by design after construction (see the classes' docstrings):
# AORecipeKwargs leaves `config` None until conversion (accelerate builds torchao's config
# at once, importing torchao).
_NOT_COMPARED = {"AORecipeKwargs": {"config"}}


def _positional(sig: inspect.Signature) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds and p.name != "self"]


def _plain(value: Any) -> Any:
    """A value as both libraries may spell it: enum members by value, names in lower case."""
    if isinstance(value, enum.Enum):
        value = value.value
    return value.lower() if isinstance(value, str) else value


def _assert_same_parameters(theirs: Any, ours: Any) -> None:
    their_sig, our_sig = inspect.signature(theirs), inspect.signature(ours)
    missing = [name for name in their_sig.parameters if name not in our_sig.parameters]
    assert not missing, f"accel's {ours.__name__} lacks accelerate's parameters {missing}"
    their_pos, our_pos = _positional(their_sig), _positional(our_sig)
    assert our_pos[: len(their_pos)] == their_pos, (
        f"{ours.__name__}: accelerate's positional order {their_pos}, accel's {our_pos}"
    )


@pytest.fixture(scope="module")
def accelerate_utils() -> Any:
    pytest.importorskip("accelerate")
    import accelerate.utils

    return accelerate.utils


@pytest.mark.parametrize("name", sorted(_CASES))
def test_constructor_takes_accelerate_parameters_in_its_order(name, accelerate_utils):
    _assert_same_parameters(getattr(accelerate_utils, name), getattr(familiar, name))


def test_accelerator_takes_accelerate_parameters_in_its_order():
    accelerate = pytest.importorskip("accelerate")
    _assert_same_parameters(accelerate.Accelerator.__init__, accel.Accelerator.__init__)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_positional_construction_gives_accelerate_field_values(name, accelerate_utils):
    args = _CASES[name]
    names = _positional(inspect.signature(getattr(accelerate_utils, name)))[: len(args)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # FP8RecipeKwargs is deprecated in both
        ours = getattr(familiar, name)(*args)
        try:
            theirs = getattr(accelerate_utils, name)(*args)
        except ImportError:  # accelerate's fp8 records need their library installed
            theirs = None
    compared = [n for n in names if n not in _NOT_COMPARED.get(name, ())]
    for field, given in zip(names, args, strict=True):
        if field in compared and given is not None:
            assert _plain(getattr(ours, field)) == _plain(given), f"{name}.{field}"
    if theirs is not None:
        got = {f: _plain(getattr(ours, f)) for f in compared}
        assert got == {f: _plain(getattr(theirs, f)) for f in compared}


def test_accelerator_positional_arguments_mean_what_they_mean_in_accelerate(tmp_path):
    dl_config = familiar.DataLoaderConfiguration(even_batches=False)
    acc = accel.Accelerator(
        True, False, "no", 2, True, dl_config, None, None, None, None, ["generator"], None,
        tmp_path, None, None, False,
    )  # fmt: skip
    assert acc.device_placement is True and acc.split_batches is False
    assert acc.mixed_precision == "no" and acc.gradient_accumulation_steps == 2
    assert acc.device.type == "cpu" and acc.dataloader_config.even_batches is False
    assert [str(r) for r in acc.rng_types] == ["generator"]
    assert acc.project_dir == str(tmp_path) and acc.step_scheduler_with_optimizer is False
    with pytest.raises(TypeError):  # accel-only and older spellings are keyword-only
        accel.Accelerator(*([None] * 21), False)


def test_project_configuration_as_scripts_write_it(tmp_path):
    config = familiar.ProjectConfiguration(str(tmp_path), automatic_checkpoint_naming=True)
    assert config.project_dir == str(tmp_path) and config.logging_dir == str(tmp_path)
    assert config.automatic_checkpoint_naming is True
    config.iteration = 4  # accelerate's load_state and users assign it
    assert config.iteration == 4
    with pytest.raises(TypeError):  # accel's own options are keyword-only
        familiar.ProjectConfiguration("out", None, False, None, 0, False, False)


def test_plugins_may_be_assigned_as_accelerate_users_do():
    plugin = familiar.GradientAccumulationPlugin(num_steps=None)  # accelerate's default: 1
    assert plugin.num_steps == 1
    plugin.num_steps = 4
    assert plugin.num_steps == 4
    dynamo = familiar.TorchDynamoPlugin(backend="inductor")
    dynamo.backend = familiar.DynamoBackend.NO  # disabling compilation after the fact
    assert dynamo.backend == "no" and not dynamo.enabled
    ddp = familiar.DistributedDataParallelKwargs()
    ddp.comm_hook = "fp16"
    assert ddp.comm_hook is familiar.DDPCommunicationHookType.FP16
    with pytest.raises(ValueError, match="comm_hook='zstd'"):
        ddp.comm_hook = "zstd"


def test_te_recipe_accepts_accelerate_name_for_eval_autocast():
    assert familiar.TERecipeKwargs(use_autocast_during_eval=True).use_during_eval is True


def test_ao_recipe_module_filter_func_decides_which_layers(monkeypatch):
    from accel_precision import ao_float8_filter

    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16))
    seen = []

    def only_first(module: nn.Module, fqn: str) -> bool:
        seen.append(fqn)
        return fqn == "0"

    keep = ao_float8_filter(model, familiar.AORecipeKwargs(module_filter_func=only_first))
    assert [n for n, m in model.named_children() if keep(m, n)] == ["0"]
    assert seen == ["0", "1", "2"]


def test_fp8_recipe_kwargs_accelerate_form_warns_as_accelerate_does():
    with pytest.warns(FutureWarning, match="deprecated"):
        kw = familiar.FP8RecipeKwargs(backend="TE", margin=2)
    assert kw.fp8_backend == "te" and kw.te.margin == 2
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="MS-AMP"):
        familiar.FP8RecipeKwargs(backend="MSAMP")
