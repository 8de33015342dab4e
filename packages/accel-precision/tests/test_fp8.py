"""fp8 on CPU: configuration, error paths, the torchao layer filter, and emulated training."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import accel_precision._fp8 as fp8_mod
from accel_precision import (
    AORecipeKwargs,
    FP8Precision,
    FP8RecipeKwargs,
    TERecipeKwargs,
    ao_float8_filter,
    check_fp8_support,
    convert_model_to_fp8_ao,
    convert_to_ao_float8,
    convert_to_te,
    has_ao_float8_layers,
    has_te_layers,
    make_precision,
    resolve_fp8_backend,
    te_fp8_autocast,
    te_recipe,
)

_EMULATED = AORecipeKwargs(emulate=True, min_features=16)


def _no_module(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:  # a None entry makes `import name` raise ImportError
        monkeypatch.setitem(sys.modules, name, None)


def test_fp8_on_cpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="'cpu'"):
        check_fp8_support("cpu")
    pytest.importorskip("torchao", reason="fp8_backend='auto' on CPU resolves to torchao")
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU of compute capability >= 8.9.*'cpu'"):
        make_precision("fp8", device_type="cpu")
    with pytest.raises(RuntimeError, match="emulate=True"):
        make_precision("fp8", device_type="cpu", fp8_kwargs=TERecipeKwargs())


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_fp8_on_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        check_fp8_support("cuda")


def test_fp8_on_a_gpu_below_capability_8_9_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100")
    with pytest.raises(RuntimeError, match=r"cuda:1 \(NVIDIA A100\) has 8.0.*'bf16'"):
        check_fp8_support("cuda:1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    check_fp8_support("cuda:0")


def test_missing_transformer_engine_names_the_extra(monkeypatch):
    _no_module(monkeypatch, "transformer_engine", "transformer_engine.pytorch")
    for call in (
        lambda: convert_to_te(nn.Linear(16, 16)),
        lambda: te_recipe(TERecipeKwargs()),
        lambda: te_fp8_autocast(),
    ):
        with pytest.raises(ImportError, match=r"pip install accel-precision\[te\]"):
            call()
    assert has_te_layers(nn.Linear(16, 16)) is False


def test_missing_torchao_names_the_extra(monkeypatch):
    _no_module(monkeypatch, "torchao", "torchao.float8", "torchao.float8.float8_linear")
    with pytest.raises(ImportError, match=r"pip install accel-precision\[ao\]"):
        make_precision("fp8", device_type="cpu", fp8_kwargs=_EMULATED)
    with pytest.raises(ImportError, match=r"pip install accel-precision\[ao\]"):
        convert_to_ao_float8(nn.Linear(16, 16))
    assert has_ao_float8_layers(nn.Linear(16, 16)) is False


def test_auto_backend_resolution(monkeypatch):
    assert resolve_fp8_backend(FP8RecipeKwargs(fp8_backend="te")) == "te"
    installed = {"transformer_engine": False, "torchao": True}
    monkeypatch.setattr(fp8_mod, "_installed", lambda name: installed[name])
    assert resolve_fp8_backend(FP8RecipeKwargs()) == "ao"
    installed["transformer_engine"] = True
    assert resolve_fp8_backend(FP8RecipeKwargs()) == "te"
    installed.update(transformer_engine=False, torchao=False)
    with pytest.raises(ImportError, match=r"accel-precision\[te\].*accel-precision\[ao\]"):
        resolve_fp8_backend(FP8RecipeKwargs())


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 64)  # first linear layer
        self.up = nn.Linear(64, 128)
        self.odd = nn.Linear(128, 60)  # 60 is not divisible by 16
        self.down = nn.Linear(60, 64)  # neither is its input
        self.narrow = nn.Linear(64, 16)  # below min_features=32
        self.back = nn.Linear(16, 64)
        self.mid = nn.Linear(64, 64)
        self.head = nn.Linear(64, 32)  # last linear layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.up(self.embed(x))
        x = self.down(self.odd(x))
        return self.head(self.mid(self.back(self.narrow(x))))


def _converted(model: nn.Module) -> set[str]:
    from torchao.float8.float8_linear import Float8Linear

    return {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}


def test_ao_filter_chooses_the_layers():
    def accepted(**kw) -> set[str]:
        model = _Stack()
        keep = ao_float8_filter(model, AORecipeKwargs(**kw))
        return {n for n, m in model.named_modules() if n and keep(m, n)}

    assert accepted(min_features=32) == {"up", "mid"}
    assert accepted(min_features=16) == {"up", "narrow", "back", "mid"}
    assert accepted(min_features=32, skip_first_last=False) == {"embed", "up", "mid", "head"}
    assert accepted(min_features=32, module_filter_fn=lambda m, fqn: fqn != "mid") == {"up"}
    assert accepted() == set()  # the default threshold (1024) finds nothing worth it here
    # accelerate's module_filter_func replaces accel's rules (as in accelerate); accel's
    # module_filter_fn is still asked on top of it.
    assert accepted(module_filter_func=lambda m, fqn: fqn in ("embed", "odd")) == {"embed", "odd"}
    both = {"module_filter_func": lambda m, fqn: True, "module_filter_fn": lambda m, fqn: fqn < "e"}
    assert accepted(**both) == {"back", "down"}


def test_ao_conversion_honours_accelerate_config_and_filter():
    float8 = pytest.importorskip("torchao.float8")
    model = _Stack()
    config = float8.Float8LinearConfig(emulate=True)
    kw = AORecipeKwargs(config, lambda m, fqn: fqn == "mid")
    convert_to_ao_float8(model, kw)
    assert _converted(model) == {"mid"}
    assert model.mid.config is config


@pytest.mark.needs("torchao")
def test_ao_default_threshold_converts_layers_large_enough_to_gain():
    model = nn.Sequential(
        nn.Linear(64, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 512), nn.Linear(512, 64)
    )
    convert_to_ao_float8(model)
    assert _converted(model) == {"1"}


def test_accelerate_form_skips_first_and_last_with_no_size_threshold():
    pytest.importorskip("torchao")
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 24), nn.Linear(24, 8))
    assert convert_model_to_fp8_ao(model) is model
    assert _converted(model) == {"1"}  # "2" has 24 out features: not divisible by 16
    mine = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 32))
    convert_model_to_fp8_ao(mine, module_filter_func=lambda m, fqn: fqn == "0")
    assert _converted(mine) == {"0"}  # the caller's filter replaces the rule


@pytest.mark.needs("torchao")
def test_ao_conversion_keeps_the_parameters():
    model = _Stack()
    params = dict(model.named_parameters())
    out = convert_to_ao_float8(model, AORecipeKwargs(min_features=32, emulate=True))
    assert out is model and has_ao_float8_layers(model)
    assert _converted(model) == {"up", "mid"}
    assert all(q is params[n] for n, q in model.named_parameters())


class _Block(nn.Module):
    """A small pre-norm transformer block (attention + MLP)."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.fc_in = nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.fc_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc_in(x)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))
        return self.fc_out(x)


def _train(precision, steps: int = 12) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    model = _Block()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model = precision.wrap_forward(precision.convert_module(model, opt))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 16, 64, generator=g), torch.randn(4, 16, 64, generator=g)
    with torch.no_grad():
        first = model(x)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        precision.backward(loss)
        precision.step(opt)
        precision.update()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, first


@pytest.mark.needs("torchao")
def test_emulated_ao_fp8_trains_and_stays_close_to_bf16():
    p = make_precision("fp8", device_type="cpu", fp8_kwargs=_EMULATED)
    assert isinstance(p, FP8Precision) and p.backend == "ao" and p.dtype == torch.bfloat16
    assert p.scaler is None and p.state_dict() == {}
    fp8_losses, fp8_out = _train(p)
    bf16_losses, bf16_out = _train(make_precision("bf16"))
    assert fp8_out.dtype == torch.float32
    assert fp8_losses[-1] < 0.7 * fp8_losses[0], fp8_losses
    rel = (fp8_out - bf16_out).norm() / bf16_out.norm()
    assert rel < 0.1, rel
    assert abs(fp8_losses[-1] - bf16_losses[-1]) < 0.1 * bf16_losses[0]
    assert not torch.equal(fp8_out, bf16_out)  # the fp8 layers really ran


@pytest.mark.needs("torchao")
def test_emulated_ao_fp8_converts_the_inner_layers_of_a_block():
    p = make_precision("fp8", device_type="cpu", fp8_kwargs=_EMULATED)
    model = p.convert_module(_Block())
    # fc_in and fc_out are the first and last linear layers in registration order
    assert {"fc1", "fc2"} <= _converted(model)
    assert not {"fc_in", "fc_out"} & _converted(model)


def test_which_layers_transformer_engine_would_take():
    from accel_precision import te_convertible

    assert te_convertible(nn.Linear(16, 32))
    assert not te_convertible(nn.Linear(15, 32)) and not te_convertible(nn.Linear(16, 30))
    assert te_convertible(nn.LayerNorm(64))
    assert not te_convertible(nn.LayerNorm((4, 16)))
    assert not te_convertible(nn.LayerNorm(64, elementwise_affine=False))
    assert not te_convertible(nn.Conv1d(16, 16, 1))


def _fake_te(monkeypatch: pytest.MonkeyPatch, mxfp8_available: bool) -> None:
    """Just enough of TransformerEngine's module tree for `te_recipe` to build a recipe."""
    import dataclasses
    import enum
    import types

    class Format(enum.Enum):
        E4M3 = "e4m3"
        HYBRID = "hybrid"

    @dataclasses.dataclass
    class MXFP8BlockScaling:
        margin: int = 0
        fp8_format: Format = Format.E4M3

    @dataclasses.dataclass
    class DelayedScaling:
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 1024
        amax_compute_algo: str = "max"

    recipe = types.SimpleNamespace(
        Format=Format, MXFP8BlockScaling=MXFP8BlockScaling, DelayedScaling=DelayedScaling
    )
    fp8 = types.SimpleNamespace(check_mxfp8_support=lambda: (mxfp8_available, "needs Blackwell"))
    pytorch = types.SimpleNamespace(fp8=fp8)
    common = types.SimpleNamespace(recipe=recipe)
    root = types.SimpleNamespace(pytorch=pytorch, common=common)
    for name, module in {
        "transformer_engine": root,
        "transformer_engine.pytorch": pytorch,
        "transformer_engine.pytorch.fp8": fp8,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": recipe,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_te_mxfp8_block_scaling_builds_te_recipe(monkeypatch):
    _fake_te(monkeypatch, mxfp8_available=True)
    rec = te_recipe(TERecipeKwargs(margin=1, fp8_format="E4M3", use_mxfp8_block_scaling=True))
    assert type(rec).__name__ == "MXFP8BlockScaling"
    assert (rec.margin, rec.fp8_format.name) == (1, "E4M3")
    assert type(te_recipe(TERecipeKwargs())).__name__ == "DelayedScaling"
    with pytest.raises(ValueError, match="amax_history_len=16 belongs to delayed scaling"):
        te_recipe(TERecipeKwargs(amax_history_len=16, use_mxfp8_block_scaling=True))


def test_te_mxfp8_block_scaling_where_unavailable_is_refused(monkeypatch):
    _fake_te(monkeypatch, mxfp8_available=False)
    with pytest.raises(ValueError, match=r"not available here \(needs Blackwell\)"):
        te_recipe(TERecipeKwargs(use_mxfp8_block_scaling=True))
