"""fp16/bf16 mixed precision and full precision on CPU: autocast, scaling, stepping, state."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from accel_precision import (
    AutocastKwargs,
    GradScalerKwargs,
    MixedPrecision,
    Precision,
    has_wrapped_forward,
    make_precision,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_bf16_autocast_changes_matmul_dtype_and_the_off_switch_restores_fp32():
    p = make_precision("bf16", device_type="cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert (a @ b).dtype == torch.float32
    with p.autocast():
        assert (a @ b).dtype == torch.bfloat16
        with p.autocast(enabled=False):
            assert (a @ b).dtype == torch.float32
        assert (a @ b).dtype == torch.bfloat16
        with p.disable_autocast():
            assert (a @ b).dtype == torch.float32
        with p.autocast():  # nested twice: still on, and still on after the inner exits
            assert (a @ b).dtype == torch.bfloat16
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32
    assert p.dtype == torch.bfloat16 and p.name == "bf16" and p.scaler is None


def test_autocast_kwargs_reach_torch():
    p = make_precision("bf16", autocast_kwargs=AutocastKwargs(cache_enabled=False))
    with p.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert not torch.is_autocast_cache_enabled()
    off = make_precision("fp16", autocast_kwargs=AutocastKwargs(enabled=False))
    with off.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32


def test_full_precision_is_a_no_op_object():
    p = make_precision("no")
    assert type(p) is Precision and p.dtype == torch.float32 and p.scaler is None
    model = _model()
    assert p.convert_module(model) is model and p.wrap_forward(model) is model
    assert not has_wrapped_forward(model)
    with p.autocast():
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32
    assert p.state_dict() == {}


def _inject(model: nn.Module, value: float) -> None:
    model[0].weight.grad[0, 0] = value


def test_fp16_scaler_skips_the_step_on_inf_and_halves_its_scale():
    p = make_precision("fp16", device_type="cpu", scaler_kwargs=GradScalerKwargs(init_scale=1024.0))
    assert isinstance(p, MixedPrecision) and isinstance(p.scaler, torch.amp.GradScaler)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    for bad in (float("inf"), float("nan")):
        before = copy.deepcopy(model.state_dict())
        scale = p.scaler.get_scale()
        with p.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y)
        p.backward(loss)
        _inject(model, bad)
        assert p.step(opt) is False
        assert p.optimizer_step_was_skipped
        p.update()
        assert p.scaler.get_scale() == scale / 2
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k
        opt.zero_grad()
    with p.autocast():
        loss = nn.functional.mse_loss(model(x).float(), y)
    p.backward(loss)
    before = copy.deepcopy(model.state_dict())
    assert p.step(opt) is True and not p.optimizer_step_was_skipped
    p.update()
    assert p.scaler.get_scale() == 256.0
    assert not torch.equal(model.state_dict()["0.weight"], before["0.weight"])


def test_fp16_backward_scales_and_unscale_gives_the_true_gradients():
    model = _model()
    ref = copy.deepcopy(model)
    p = make_precision("fp16", scaler_kwargs=GradScalerKwargs(init_scale=512.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    p.backward(nn.functional.mse_loss(model(x), y))
    # The same float32 operations on the same numbers, the scaled ones times a power of two:
    # scaling by 2**9 commutes with every rounding, so the gradients are exactly 512 times
    # the true ones, and unscaling gives them back bit for bit.
    assert torch.equal(model[0].weight.grad, 512.0 * _grad(ref, x, y))
    p.unscale_(opt)
    assert torch.equal(model[0].weight.grad, ref[0].weight.grad)


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    nn.functional.mse_loss(model(x), y).backward()
    return model[0].weight.grad


@pytest.mark.parametrize("mode", ["fp16", "bf16", "no", "bf16-true"])
def test_a_second_unscale_in_one_step_raises(mode):
    p = make_precision(mode)
    model = p.convert_module(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # the second round shows update() starts a fresh step
        p.backward(model(torch.randn(3, 8, dtype=p.dtype if "true" in mode else None)).sum())
        p.unscale_(opt)
        with pytest.raises(
            RuntimeError, match=r"unscale_\(\) was already called .*SGD.* once per step"
        ):
            p.unscale_(opt)
        assert p.step(opt) is True
        p.update()
        opt.zero_grad()


def test_scaler_state_round_trips_through_a_file(tmp_path):
    kw = GradScalerKwargs(init_scale=2.0**12, growth_interval=3)
    p = make_precision("fp16", scaler_kwargs=kw)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(5):  # one skip, then clean steps: scale and growth tracker both move
        p.backward(model(torch.randn(2, 8)).sum())
        if i == 0:
            _inject(model, float("inf"))
        p.step(opt)
        p.update()
        opt.zero_grad()
    state = p.state_dict()
    torch.save(state, tmp_path / "scaler.pt")
    fresh = make_precision("fp16")
    fresh.load_state_dict(torch.load(tmp_path / "scaler.pt"))
    assert fresh.state_dict() == state
    assert state["scale"] == 2.0**12  # halved once, doubled once after 3 clean steps
    assert state["_growth_tracker"] == 1
    assert fresh.scaler.get_scale() == p.scaler.get_scale()


def test_state_dict_in_modes_without_a_scaler():
    p = make_precision("bf16")
    assert p.state_dict() == {}
    p.load_state_dict({})
    with pytest.warns(UserWarning, match="no loss scaler; the scaler state .* is ignored"):
        p.load_state_dict(make_precision("fp16").state_dict())
    fp16 = make_precision("fp16", scaler_kwargs=GradScalerKwargs(init_scale=8.0))
    fp16.load_state_dict({})  # a checkpoint from a bf16 run leaves the fresh scaler alone
    assert fp16.scaler.get_scale() == 8.0


def test_wrap_forward_returns_fp32_equal_to_autocast_and_unwraps_to_the_original():
    model = _model()
    p = make_precision("bf16")
    x = torch.randn(5, 8)
    with p.autocast():
        expected = model(x)
    assert expected.dtype == torch.bfloat16
    assert p.wrap_forward(model) is model and has_wrapped_forward(model)
    p.wrap_forward(model)  # wrapping twice does not stack
    out = model(x)
    assert out.dtype == torch.float32 and torch.equal(out, expected.float())
    out.sum().backward()
    assert model[0].weight.grad is not None
    assert p.unwrap_forward(model) is model and not has_wrapped_forward(model)
    assert "forward" not in model.__dict__
    assert model.forward.__func__ is nn.Sequential.forward
    assert model(x).dtype == torch.float32


def test_wrap_forward_converts_nested_outputs_and_keeps_an_instance_forward():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> dict:
            h = self.lin(x)
            return {"h": h, "pair": (h, torch.arange(3)), "list": [h]}

    net = Net()
    custom = net.forward
    net.forward = custom  # an instance attribute, as other wrappers leave behind
    p = make_precision("bf16")
    p.wrap_forward(net)
    out = net(torch.randn(2, 4))
    assert out["h"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["pair"][1].dtype == torch.int64 and out["list"][0].dtype == torch.float32
    p.unwrap_forward(net)
    assert net.__dict__["forward"] is custom


def test_bad_mode_and_device_type_are_named():
    with pytest.raises(ValueError, match=r"mode 'fp32' is not known; expected one of 'no', 'fp16'"):
        make_precision("fp32")
    with pytest.raises(ValueError, match=r"device_type='cuda:0'"):
        make_precision("bf16", device_type="cuda:0")
    with pytest.raises(ValueError, match=r"device_type='tpu'"):
        make_precision("bf16", device_type="tpu")
    with pytest.warns(UserWarning, match="scaler_kwargs apply to mixed precision 'fp16' only"):
        make_precision("bf16", scaler_kwargs=GradScalerKwargs())
    assert make_precision("BF16").name == "bf16"


def test_sharded_flag_picks_fsdp_sharded_grad_scaler():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert isinstance(make_precision("fp16", sharded=True).scaler, ShardedGradScaler)
    assert not isinstance(make_precision("fp16").scaler, ShardedGradScaler)
    assert make_precision("bf16", sharded=True).scaler is None


def _sharded_worker() -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        p = make_precision("fp16", sharded=True, scaler_kwargs=GradScalerKwargs(init_scale=64.0))
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        results = []
        for step in range(2):
            p.backward(model(torch.randn(3, 4)).sum())
            if step == 0 and rank == 1:  # only rank 1 sees an inf
                model.weight.grad[0, 0] = float("inf")
            results.append(p.step(opt))
            p.update()
            opt.zero_grad()
        return {"stepped": results, "scale": p.scaler.get_scale()}
    finally:
        dist.destroy_process_group()


@pytest.mark.needs("accel_state")  # its spawner; accel-precision alone does not have it
def test_sharded_scaler_skips_on_every_rank_when_one_rank_overflows():
    from accel_state.testing import run_distributed

    out = run_distributed(_sharded_worker, world_size=2, timeout=120)
    assert out == [{"stepped": [False, True], "scale": 32.0}] * 2
