"""Rebinding an optimizer to the new parameters a layer conversion made."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from accel_precision import rebind_optimizer


def _swap_layer(model: nn.Sequential, index: int) -> None:
    """What a TE conversion does: a new module with copied weights, same parameter names."""
    model[index] = copy.deepcopy(model[index])


def test_rebound_optimizer_trains_the_new_parameters_and_keeps_its_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    before = dict(model.named_parameters())
    _swap_layer(model, 2)
    after = dict(model.named_parameters())
    assert rebind_optimizer(opt, before, after) == 2
    new = {id(p) for g in opt.param_groups for p in g["params"]}
    assert new == {id(p) for p in model.parameters()}
    assert opt.state[model[2].weight]["step"].item() == 1  # Adam's state moved along
    w = model[2].weight.detach().clone()
    model(x).sum().backward()
    opt.step()
    assert not torch.equal(model[2].weight, w)
    assert rebind_optimizer(opt, after, after) == 0


def test_a_vanished_parameter_is_named():
    model = nn.Sequential(nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyError, match="'0.bias' is gone"):
        rebind_optimizer(opt, dict(model.named_parameters()), {"0.weight": model[0].weight})
