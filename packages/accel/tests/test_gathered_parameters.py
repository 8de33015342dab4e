"""`accel.utils.GatheredParameters` as accelerate serves it: DeepSpeed's ZeRO-3 gather for
partitioned parameters, a no-op context for whole ones.

One 2-process gloo launch (DeepSpeed ZeRO-3 on CPU, as in test_deepspeed.py) checks the no-op
before DeepSpeed is imported, then the full shapes inside the block, the shards outside it,
and a change made by `modifier_rank=0` reaching every rank: parameters partitioned as they are
made (`zero3_init_flag`), and by `prepare` (the flag off, where accelerate's is a no-op).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import pytest
import torch
from torch import nn

from accel_state.testing import run_distributed
from accel_testkit.extensions import torch_extensions_dir

SHAPES = {"0.weight": [6, 4], "0.bias": [6], "2.weight": [3, 6], "2.bias": [3]}
EXTENSIONS = torch_extensions_dir()
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install accel-parallel[deepspeed])",
)


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _shapes(model: nn.Module) -> dict[str, list[int]]:
    """{name: shape}, without the `module.` a DeepSpeed engine puts before each name."""
    return {name.removeprefix("module."): list(p.shape) for name, p in model.named_parameters()}


def _copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# -- without ZeRO-3: a no-op ---------------------------------------------------------------------
def _no_op_checks() -> dict[str, Any]:
    """Whole parameters go through every form of the call unchanged, a change made inside the
    block stays (on every rank: there is nothing to broadcast), and DeepSpeed is not imported."""
    from accel.utils import GatheredParameters

    net = make_net()
    before = _copy(net)
    out: dict[str, Any] = {}
    with GatheredParameters(net.parameters(), modifier_rank=0):  # a generator
        out["inside"] = _shapes(net)
    with GatheredParameters(net[0].weight, modifier_rank=None, fwd_module=net):  # one tensor
        pass
    with GatheredParameters(list(net.parameters()), enabled=False):
        pass
    out["unchanged"] = all(torch.equal(p, before[n]) for n, p in net.named_parameters())
    with torch.no_grad(), GatheredParameters([net[2].bias], modifier_rank=0):
        net[2].bias.fill_(7.0)
    out["kept"] = net[2].bias.tolist()
    out["deepspeed_imported"] = "deepspeed" in sys.modules
    return out


def test_without_zero3_it_is_a_no_op_context() -> None:
    out = _no_op_checks()
    assert out["inside"] == SHAPES
    assert out["unchanged"] is True
    assert out["kept"] == [7.0, 7.0, 7.0]


def test_the_familiar_paths_serve_one_function() -> None:
    from accel.utils import GatheredParameters, operations, transformer_engine
    from accel_parallel.familiar import GatheredParameters as owned

    assert GatheredParameters is owned
    assert operations.GatheredParameters is owned
    assert transformer_engine.GatheredParameters is owned


def test_an_exception_inside_the_block_propagates() -> None:
    from accel.utils import GatheredParameters

    with pytest.raises(KeyError, match="inside"), GatheredParameters(make_net().parameters()):
        raise KeyError("inside")


# -- under ZeRO-3, on 2 processes ----------------------------------------------------------------
def _gather_round(acc: Any, model: nn.Module, fill: float) -> dict[str, Any]:
    """Shapes outside and inside, then rank 0 fills every parameter with `fill` (the other
    ranks with -1) under modifier_rank=0; what every rank sees gathered afterwards."""
    from accel.utils import GatheredParameters

    out: dict[str, Any] = {"outside": _shapes(model)}
    with GatheredParameters(model.parameters()):
        out["inside"] = _shapes(model)
    with torch.no_grad(), GatheredParameters(list(model.parameters()), modifier_rank=0):
        for p in model.parameters():
            p.fill_(fill if acc.process_index == 0 else -1.0)
    out["after_exit"] = _shapes(model)
    with GatheredParameters(model.parameters()):
        out["values"] = sorted({v for p in model.parameters() for v in p.flatten().tolist()})
    return out


def _zero3_checks() -> dict[str, Any]:
    sys.modules["transformers"] = None  # type: ignore[assignment]  # not needed here
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # DeepSpeed's autotuner's, unused
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", EXTENSIONS)
    out = {"no_op": _no_op_checks()}

    from accel import Accelerator
    from accel.state import AcceleratorState
    from accel.utils import DeepSpeedPlugin

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True))
    with acc.deepspeed_plugin.zero3_init():  # partitioned as they are made
        net = make_net()
    out["built"] = _gather_round(acc, net, 0.5)
    out["prepared"] = _gather_round(acc, _prepared(acc, net), 0.25)

    # zero3_init_flag off: whole until prepare, partitioned by it (accelerate's no-op here)
    AcceleratorState._reset_state(reset_partial_state=False)
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False))
    out["flag_off"] = _gather_round(acc, _prepared(acc, make_net()), 0.125)
    return out


def _prepared(acc: Any, net: nn.Module) -> nn.Module:
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=2)  # fills the config's batch sizes
    return acc.prepare(net, optimizer, loader)[0]


@pytest.fixture(scope="module")
def zero3() -> list[dict[str, Any]]:
    return run_distributed(_zero3_checks, world_size=2, timeout=300)


@needs_deepspeed
def test_deepspeed_is_imported_only_when_a_parameter_is_partitioned(zero3) -> None:
    for rank in zero3:
        assert rank["no_op"]["deepspeed_imported"] is False
        assert rank["no_op"]["inside"] == SHAPES and rank["no_op"]["unchanged"] is True


@needs_deepspeed
@pytest.mark.parametrize("when", ["built", "prepared", "flag_off"])
def test_zero3_full_inside_partitioned_outside(zero3, when) -> None:
    for rank in zero3:
        result = rank[when]
        assert result["inside"] == SHAPES
        for shapes in (result["outside"], result["after_exit"]):
            assert shapes == {key: [0] for key in SHAPES}  # DeepSpeed's empty stand-ins


@needs_deepspeed
@pytest.mark.parametrize(
    ("when", "fill"), [("built", 0.5), ("prepared", 0.25), ("flag_off", 0.125)]
)
def test_zero3_a_change_by_the_modifier_rank_reaches_every_rank(zero3, when, fill) -> None:
    assert [rank[when]["values"] for rank in zero3] == [[fill], [fill]]
