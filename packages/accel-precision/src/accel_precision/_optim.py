"""Point an optimizer at a model's new parameters after a conversion replaced them."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def rebind_optimizer(
    optimizer: torch.optim.Optimizer,
    before: Mapping[str, torch.nn.Parameter],
    after: Mapping[str, torch.nn.Parameter],
) -> int:
    """Replace, in `optimizer`, each parameter of `before` by the one of the same name in `after`.

    `before`/`after` are `dict(model.named_parameters())` taken around a conversion that made new
    parameter tensors (TransformerEngine layers do). Optimizer state moves with its parameter.
    Returns how many of the optimizer's parameters were replaced. A parameter that disappeared raises, naming it.
    """
    new_for = {}
    for name, old in before.items():
        new = after.get(name)
        if new is None:
            raise KeyError(
                f"parameter {name!r} is gone after the conversion, so the optimizer cannot be "
                f"rebound to it; create the optimizer after converting the model."
            )
        if new is not old:
            new_for[id(old)] = new
    replaced = 0
    for group in optimizer.param_groups:
        params = group["params"]
        group["params"] = [new_for.get(id(p), p) for p in params]
        replaced += sum(a is not b for a, b in zip(params, group["params"]))
    for old in [p for p in optimizer.state if id(p) in new_for]:
        optimizer.state[new_for[id(old)]] = optimizer.state.pop(old)
    return replaced
