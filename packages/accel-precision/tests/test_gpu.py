"""On a CUDA GPU: fp16 with loss scaling, and fp8 with each backend on a small transformer block."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_precision import (
    AORecipeKwargs,
    GradScalerKwargs,
    TERecipeKwargs,
    has_ao_float8_layers,
    has_te_layers,
    make_precision,
)

pytestmark = pytest.mark.gpu


def _needs_fp8() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")


class _Block(nn.Module):
    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.fc_in = nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.fc_out = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc_in(x)
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))
        return self.fc_out(x)


def _train(precision, steps: int = 20) -> tuple[list[float], torch.Tensor, nn.Module]:
    torch.manual_seed(0)
    model = _Block().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = precision.wrap_forward(precision.convert_module(model, opt))
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(8, 64, 256, device="cuda", generator=g)
    y = torch.randn(8, 64, 256, device="cuda", generator=g)
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
    return losses, first, model


@pytest.mark.parametrize("fused", [False, True])
def test_fp16_on_cuda_trains_and_skips_on_inf(fused):
    p = make_precision(
        "fp16", device_type="cuda", scaler_kwargs=GradScalerKwargs(init_scale=1024.0)
    )
    losses, out, _ = _train(p)
    assert out.dtype == torch.float32
    assert losses[-1] < 0.8 * losses[0], losses
    model = nn.Linear(16, 16).cuda()
    # fused AdamW unscales inside its own kernel (GradScaler hands it the scale)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    scale = p.scaler.get_scale()
    p.backward(model(torch.randn(4, 16, device="cuda")).sum())
    model.weight.grad[0, 0] = float("inf")
    before = model.weight.detach().clone()
    assert p.step(opt) is False and p.optimizer_step_was_skipped
    assert torch.equal(model.weight, before)
    p.update()
    assert p.scaler.get_scale() == scale / 2
    opt.zero_grad()
    p.backward(model(torch.randn(4, 16, device="cuda")).sum())
    assert p.step(opt) is True and not p.optimizer_step_was_skipped
    assert not torch.equal(model.weight, before)


def _check_close_to_bf16(losses: list[float], out: torch.Tensor) -> None:
    ref_losses, ref_out, _ = _train(make_precision("bf16", device_type="cuda"))
    assert losses[-1] < 0.8 * losses[0], losses
    rel = ((out - ref_out).norm() / ref_out.norm()).item()
    assert rel < 0.1, rel
    assert abs(losses[-1] - ref_losses[-1]) < 0.05 * ref_losses[0], (losses, ref_losses)


def test_fp8_torchao_block_trains_close_to_bf16():
    _needs_fp8()
    pytest.importorskip("torchao.float8")
    p = make_precision("fp8", device_type="cuda", fp8_kwargs=AORecipeKwargs(min_features=256))
    losses, out, model = _train(p)
    assert has_ao_float8_layers(model)
    _check_close_to_bf16(losses, out)


def test_fp8_transformer_engine_block_trains_close_to_bf16():
    _needs_fp8()
    pytest.importorskip("transformer_engine.pytorch")
    p = make_precision("fp8", device_type="cuda", fp8_kwargs=TERecipeKwargs(amax_history_len=16))
    losses, out, model = _train(p)
    assert has_te_layers(model)
    _check_close_to_bf16(losses, out)


# -- torchao's recipes at the widths fp8 is meant for ---------------------------------------------
# Error budget against bf16 (whose own rounding, 2**-9 relative, is small beside fp8's). A value
# scaled into fp8's range is rounded by at most half a step: 2**-4 of its binade's base in
# e4m3 (3 mantissa bits), 2**-3 in e5m2; over a binade that is 0.026 (e4m3) and 0.052 (e5m2)
# RMS relative. Independent errors add in quadrature, and a GEMM's output keeps its operands'
# relative error in its norm. Forward, two GEMMs with both operands in e4m3: sqrt(4) x 0.026
# = 0.052. The first layer's weight gradient: the loss gradient carries the output's error
# (0.052); the second layer's input-gradient GEMM rounds it (e5m2 under tensorwise, 0.052) and
# its weight (0.026); the weight-gradient GEMM rounds that gradient again (0.052) and the input
# (0.026): sqrt(0.052**2 x 4 + 0.026**2 x 2) = 0.11. Bounds: about twice those, 0.10 and 0.20
# (rowwise keeps every operand in e4m3: within them too); fp8 must also differ from bf16 by
# more than bf16's own rounding (0.002), or no fp8 GEMM ran.
FP8_FORWARD, FP8_GRADIENT, BF16_ROUNDING = 0.10, 0.20, 0.002


def _wide_pass(precision, width: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, width, bias=False), nn.GELU(), nn.Linear(width, width, bias=False)
    ).cuda()
    model = precision.wrap_forward(precision.convert_module(model))
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(tokens, width, device="cuda", generator=g)
    out = model(x)
    out.float().pow(2).mean().backward()
    return out.detach().float(), model[0].weight.grad.detach().float(), model


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("width", [4096, 8192])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_torchao_recipes_at_width_agree_with_bf16(recipe: str, width: int) -> None:
    _needs_fp8()
    pytest.importorskip("torchao.float8")
    kw = AORecipeKwargs(recipe=recipe, skip_first_last=False, min_features=0)
    out, grad, model = _wide_pass(
        make_precision("fp8", device_type="cuda", fp8_kwargs=kw), width, 4096
    )
    assert has_ao_float8_layers(model)
    ref_out, ref_grad, _ = _wide_pass(make_precision("bf16", device_type="cuda"), width, 4096)
    forward, gradient = _relative(out, ref_out), _relative(grad, ref_grad)
    assert BF16_ROUNDING < forward < FP8_FORWARD, (recipe, width, forward)
    assert gradient < FP8_GRADIENT, (recipe, width, gradient)
