"""The float32 arithmetic that compares two runs of one training: how far rounding alone may
move their gradients (float32_error, norm_terms) and how far apart their weights, losses and
outputs may end (training_drift and the assertions)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = [
    "assert_same_forward",
    "assert_same_losses",
    "assert_same_training",
    "float32_error",
    "norm_terms",
    "training_drift",
]


# -- two runs of one training, compared -------------------------------------------------------
#
# Runs of one training that differ only in how the work is split (processes, shards, stages,
# micro-batches, a resume on another number of processes) differ by float32 rounding alone:
# a reduction that adds its N terms in another order changes the sum by at most N * 2**-24 of
# the sum of their magnitudes, and a forward or backward pass through L layers chains L such
# reductions (float32_error). With SGD the step is linear in the gradient, so gradients that
# differ by a fraction e move the weights apart by about e of how far the step moved them,
# and k steps add at most k such errors. The weights are compared tensor by tensor against
# how far training moved them,
#     drift = ||run - reference|| / ||reference - start||  <=  k * e.
# These runs measure drifts of 1e-7 to 1e-5, 90 to thousands of times below that bound; a
# broken feature (a missing or doubled reduction, a wrong shard, a lost optimizer state,
# another clip coefficient) changes the gradients by a large fraction: a drift of 0.1 or
# more. Adam would break the linearity: its step lr * m / (sqrt(v) + eps) is about lr
# whatever the gradient's size, so a gradient that is zero up to rounding can move a weight
# by +-lr. Where Adam must stay (DeepSpeed), its eps is above every gradient element.


def float32_error(layers: int, terms: int, norm_terms: int = 0) -> float:
    """Relative float32 error of a step's gradients (or of a forward pass): `layers` layers
    whose reductions add at most `terms` terms, 2 * layers + 1 chained reductions (the
    forward, the backward, the sum over the batch that makes a weight gradient), and where
    the gradients are clipped, the global norm's chain (`norm_terms`), which scales every
    gradient. That first-order worst case times 10 for what it leaves out: a gradient that is
    a small difference of large terms (its rounding is relative to the terms), the steps'
    effect on later gradients."""
    return 10 * ((2 * layers + 1) * terms + norm_terms) * 2.0**-24


def norm_terms(params: Iterable[torch.Tensor]) -> int:
    """The global gradient norm's chain of sums: torch takes each gradient's norm (its numel
    terms), then the norm of those norms."""
    sizes = [p.numel() for p in params]
    return max(sizes) + len(sizes)


def training_drift(
    state: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    start: dict[str, torch.Tensor],
) -> dict[str, float]:
    """Per tensor: ||state - reference|| / ||reference - start||, where `start` holds the
    weights both runs started from (0 where training did not move a tensor and the run
    equals it, inf where it differs)."""
    out = {}
    for key, want in reference.items():
        want = want.detach().double()
        apart = float((state[key].detach().double() - want).norm())
        moved = float((want - start[key].detach().double()).norm())
        out[key] = apart / moved if moved else (0.0 if apart == 0 else float("inf"))
    return out


def assert_same_training(
    state: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    start: dict[str, torch.Tensor],
    bound: float,
) -> None:
    """The same tensors, each within `bound` of how far training moved it from `start`."""
    assert sorted(state) == sorted(reference)
    drift = training_drift(state, reference, start)
    worst = max(drift, key=drift.__getitem__)
    assert drift[worst] <= bound, f"{worst}: {drift[worst]:.2e} of its training movement apart"


def assert_same_losses(
    losses: list[float], reference: list[float], forward: float, bound: float
) -> None:
    """Each step's loss within the forward pass's rounding (`forward` of the loss) plus
    `bound` of how far the reference's loss moved since the first step (weights apart by
    `bound` of their movement change the loss by about that fraction of its change)."""
    assert len(losses) == len(reference)
    for step, (got, want) in enumerate(zip(losses, reference)):
        allowed = forward * abs(want) + bound * abs(want - reference[0])
        assert abs(got - want) <= allowed, (step, got, want, allowed)


def assert_same_forward(got: torch.Tensor, want: torch.Tensor, error: float) -> None:
    """Outputs of the same weights computed in another split: within `error` of the largest
    output (a rounding error is relative to the terms summed, not to a result that cancels
    to near zero)."""
    scale = float(want.detach().abs().max())
    torch.testing.assert_close(got, want, rtol=0.0, atol=error * scale)
