"""What differs between the torch releases accel supports in `torch.distributed.pipelining`.

Four things on torch 2.9 (accel declares torch>=2.9), each silent or fatal there:

- Its schedules open every run with a handshake between neighbouring stages
  (``_get_init_p2p_neighbors_ops``, one batched send and receive each way) that receives into a
  float32 tensor of one element (4 bytes) what the other side sends as an int64 scalar
  (8 bytes). Over gloo the receiving rank aborts (``op.preamble.length <= op.nbytes. 8 vs 4``)
  in the first step of every pipeline. The stage of `pipeline_stage` sends what the neighbour
  receives.
- A schedule's first step infers the stages' shapes by running each stage's forward under
  ``torch.no_grad()`` (``_shape_inference``). Under autocast that forward fills autocast's
  cache of low-precision weight copies with copies that have no autograd history, and the
  step's real forwards, in the same autocast region, reuse them: no gradient reaches the
  weights, and the first step of a mixed-precision pipeline silently trains nothing. The
  stage of `pipeline_stage` infers its shapes with that cache off.
- After the backward the stage divides each gradient by the number of micro-batches in place
  (``scale_grads``), and torch 2.9's DTensor leaves an in-place division of a
  ``Partial(sum)`` DTensor undone: the gradients of weights that tensor parallel keeps whole
  while their inputs are split (the norms of sequence parallel) stay summed over the
  micro-batches, a step that many times too large. The stage of `pipeline_stage` divides the
  local tensors (right for every placement: a division by a number commutes with the sum).
- ``schedule.step`` takes no ``return_outputs`` (it always returns the last stage's merged
  outputs, and any other keyword goes to the first stage's forward): `step_keywords` passes
  it only where the schedule accepts it.

Later torch releases (the locked 2.15 among them) dropped the handshake, infer shapes with
gradients on and divide a ``Partial`` DTensor in place; there torch's own stage is used as it is.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from accel_parallel._dtensor import local


def pipeline_stage(
    module: torch.nn.Module,
    index: int,
    num_stages: int,
    device: torch.device,
    group: Any,
) -> Any:
    """``torch.distributed.pipelining.PipelineStage(module, index, num_stages, device, group)``,
    on torch 2.9 with its handshake, shape inference and gradient scaling mended (see above)."""
    from torch.distributed.pipelining import PipelineStage

    if not any(hasattr(PipelineStage, name) for name in _MENDED):
        return PipelineStage(module, index, num_stages, device, group=group)
    return _mended_stage_class()(module, index, num_stages, device, group=group)


# torch 2.9's (gone later): where torch has them, the stage is the mended one
_MENDED = ("_get_init_p2p_neighbors_ops", "_shape_inference")


@functools.cache
def _mended_stage_class() -> type:
    """Made on first use: importing accel_parallel does not import torch's pipelining."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    class MendedStage(PipelineStage):
        def _get_init_p2p_neighbors_ops(self) -> list[Any]:
            ops = super()._get_init_p2p_neighbors_ops()
            for op in ops:  # the receives are float32 of one element: send the same
                if op.op is dist.isend:
                    op.tensor = torch.zeros(1, device=op.tensor.device)
            return ops

        def _shape_inference(self, *args: Any, **kwargs: Any) -> Any:
            cache = torch.is_autocast_cache_enabled()
            torch.set_autocast_cache_enabled(False)  # no weight copies without autograd
            try:
                return super()._shape_inference(*args, **kwargs)
            finally:
                torch.set_autocast_cache_enabled(cache)

        def scale_grads(self, grad_scale_factor: int) -> None:
            if grad_scale_factor != 1:
                for p in self.submod.parameters():
                    if p.grad is not None:
                        local(p.grad).div_(grad_scale_factor)

    return MendedStage


def step_keywords(schedule: Any) -> dict[str, Any]:
    """The keywords of a training ``schedule.step`` beyond the inputs, target and losses:
    ``return_outputs=False`` (the outputs of a training step are not used) where accepted."""
    return {"return_outputs": False} if _accepts_return_outputs(type(schedule)) else {}


@functools.cache
def _accepts_return_outputs(cls: type) -> bool:
    return "return_outputs" in inspect.signature(cls.step).parameters
