"""From a traced step to each engine's per-device peak and its communication per step.

FSDP2 is traced with the engine applied (see `_memory_trace`); the others are derived from the
traced step of the plain model by the engine's rules, applied to the traced sizes at every
moment the tracker recorded (sharding can move the peak, e.g. from the optimizer step to the
backward), the largest result being the peak:
- DDP keeps a second copy of the gradients in its buckets (accel's default
  `gradient_as_bucket_view=False`).
- ZeRO (DeepSpeed's stage rules): optimizer states split over the ranks from stage 1, gradients
  from stage 2, parameters from stage 3; an fp32 master partition; bf16/fp16 parameters under
  mixed precision; DeepSpeed's default reduce bucket (5e8 elements, allocated whole);
  at stage 3 the gathered unit and the prefetched one; offload moves the optimizer states and master
  weights (and at stage 3 the parameter partitions) to the host.
- FSDP2 with CPU offload: the traced FSDP2 step less the sharded parameters, gradients and
  optimizer states, which live on the host.
"""

from __future__ import annotations

from typing import Any

from accel_parallel._memory_trace import CATEGORIES, Sizes

# DeepSpeed's default reduce_bucket_size, in elements
ZERO_BUCKET = 500_000_000
# the host link's bytes count this many times a collective's bytes in the step cost
HOST_COST = 4
# activation checkpointing runs the forward again: one pass more of three
RECOMPUTE_COST = 4 / 3

_OFFLOADED_BY_FSDP = ("Sharded Param", "Sharded Grad", "OptState")


def by_category(
    raw: dict[str, int], category_of: dict[str, str], drop: tuple = ()
) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for name, nbytes in raw.items():
        if name not in drop:
            out[category_of[name]] += nbytes
    return out


def ring(world_size: int) -> float:
    """The bytes one rank sends per byte of a ring all-gather or reduce-scatter."""
    return (world_size - 1) / world_size


def ddp(base: dict[str, int], sizes: Sizes, world_size: int) -> tuple[dict[str, int], int, str]:
    parts = dict(base)
    if world_size == 1:
        return parts, 0, "one process: no DDP wrapper, no buckets"
    parts["communication"] += sizes.trained_bytes
    comm = int(2 * ring(world_size) * sizes.trained_bytes)
    return parts, comm, "traced on one device; DDP's gradient buckets (one more copy) added"


def fsdp2_cost(sizes: Sizes, world_size: int, mixed_precision: str, reshard: bool) -> int:
    compute = 2 * sizes.numel if mixed_precision != "no" else sizes.param_bytes
    gathers = 2 if reshard else 1
    return int(ring(world_size) * (gathers * compute + sizes.trained_bytes))


def fsdp2_offload(
    raw: dict[str, int], category_of: dict[str, str], sizes: Sizes, world_size: int
) -> tuple[dict[str, int], int]:
    parts = by_category(raw, category_of, drop=_OFFLOADED_BY_FSDP)
    host = (sizes.param_bytes + sizes.trained_bytes) // world_size
    return parts, host


def zero(
    base: dict[str, int],
    sizes: Sizes,
    stage: int,
    world_size: int,
    mixed_precision: str,
    offload: bool,
) -> tuple[dict[str, int], int, int]:
    """Parts, communication bytes and host bytes per step of ZeRO-`stage` at one moment of
    the plain step (cast to bf16/fp16 under mixed precision, as DeepSpeed runs it)."""
    n = world_size
    half = mixed_precision != "no"
    model_w = 2 * sizes.numel if half else sizes.param_bytes  # bf16/fp16 when cast
    model_g = 2 * sizes.trained_numel if half else sizes.trained_bytes
    master = 4 * sizes.trained_numel // n  # fp32 partition of the trained parameters
    grad_fp32 = 4 * sizes.trained_numel // n
    elem = 2 if half else 4
    traced_grads = base["gradients"] > 0
    parts = dict(base)
    parts["weights"] = (model_w // n if stage == 3 else model_w) + (0 if offload else master)
    if stage == 1:
        parts["gradients"] = (model_g if traced_grads else 0) + (0 if offload else grad_fp32)
    else:
        parts["gradients"] = 0 if offload else grad_fp32
    # the traced states are in the parameters' dtype (bf16/fp16 when cast); DeepSpeed keeps
    # them in float32 on the master partition
    states = base["optimizer_states"] * (2 if half else 1)
    parts["optimizer_states"] = 0 if offload else states // n
    # the contiguous gradient bucket (contiguous_gradients, on by default) is allocated whole,
    # whatever the model's size
    comm = ZERO_BUCKET * elem
    if stage == 3 and n > 1:  # the gathered unit and the one prefetched
        comm += 2 * (sizes.largest_unit_bytes // 2 if half else sizes.largest_unit_bytes)
    parts["communication"] = base["communication"] + comm
    gathers = 2 if stage == 3 else 1
    step_comm = int(ring(n) * (gathers * model_w + model_g)) if n > 1 else 0
    host = grad_fp32 + master if offload else 0  # gradients down, updated weights up
    return parts, step_comm, host


def step_cost(comm_bytes: int, host_bytes: int, recompute: bool) -> float:
    """The ranking key of a configuration: bytes moved per step (host bytes weighted by
    HOST_COST), times RECOMPUTE_COST with activation checkpointing."""
    cost = float(comm_bytes + HOST_COST * host_bytes)
    return cost * RECOMPUTE_COST if recompute else cost


def formula(sizes: Sizes, optimizer_states: int) -> dict[str, int]:
    """The cross-check when the step cannot be traced: weights, fp32 gradients and the
    optimizer's states per parameter; activations are not included."""
    parts = dict.fromkeys(CATEGORIES, 0)
    parts["weights"] = sizes.param_bytes
    parts["gradients"] = sizes.trained_bytes
    parts["optimizer_states"] = optimizer_states * sizes.trained_bytes
    return parts


def describe(parts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in parts.items())
