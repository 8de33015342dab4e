"""True half precision: the weights are cast, inputs follow, outputs come back fp32, it trains."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_precision import HalfPrecision, has_wrapped_forward, make_precision


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(64, 1, generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))


@pytest.mark.parametrize(
    ("mode", "dtype"), [("bf16-true", torch.bfloat16), ("fp16-true", torch.float16)]
)
def test_true_half_casts_the_weights_and_trains(mode, dtype):
    p = make_precision(mode, device_type="cpu")
    assert isinstance(p, HalfPrecision) and p.name == mode and p.dtype == dtype
    assert p.scaler is None and p.state_dict() == {}
    model = _model()
    # built before the cast: the same parameters. eps=1e-8 (the default) is 0 in fp16.
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-4)
    model = p.wrap_forward(p.convert_module(model, opt))
    assert all(t.dtype == dtype for t in model.state_dict().values())
    assert {id(q) for q in model.parameters()} == {
        id(q) for g in opt.param_groups for q in g["params"]
    }
    x, y = _data()  # fp32 data: the wrapper casts it
    losses = []
    for _ in range(30):
        out = model(x)
        assert out.dtype == torch.float32
        loss = nn.functional.mse_loss(out, y)
        p.backward(loss)
        p.unscale_(opt)  # nothing to unscale, and no "Attempting to unscale FP16 gradients"
        assert model[0].weight.grad.dtype == dtype
        assert p.step(opt) is True
        p.update()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    p.unwrap_forward(model)
    assert not has_wrapped_forward(model)
    with pytest.raises(RuntimeError):  # without the wrapper, fp32 input meets half weights
        model(x)


def test_true_half_matches_a_hand_cast_model():
    p = make_precision("bf16-true")
    model = _model()
    ref = _model().to(torch.bfloat16)
    p.wrap_forward(p.convert_module(model))
    x, _ = _data()
    assert torch.equal(model(x), ref(x.to(torch.bfloat16)).float())
    ints = torch.arange(4)
    emb = p.wrap_forward(p.convert_module(nn.Embedding(4, 8)))
    assert emb(ints).dtype == torch.float32  # integer inputs are not cast


def test_true_half_autocast_is_a_no_op():
    p = make_precision("fp16-true")
    with p.autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32
