"""What differs between the torch releases accel supports in `torch.distributed.pipelining`.

Four things on torch 2.9 (accel declares torch>=2.9), each silent or fatal there:

- Its schedules open every run with a handshake between neighbouring stages
  (``_get_init_p2p_neighbors_ops``, one batched send and receive each way) that receives into a
  float32 tensor of one element (4 bytes) what the other side sends as an int64 scalar
  (8 bytes). Over gloo the receiving rank aborts (``op.preamble.length <= op.nbytes. 8 vs 4``)
  in the first step of every pipeline. A mended stage (`mend_pipeline_stage`) sends what the
  neighbour receives.
- A schedule's first step infers the stages' shapes by running each stage's forward under
  ``torch.no_grad()`` (``_shape_inference``). Under autocast that forward fills autocast's
  cache of low-precision weight copies with copies that have no autograd history, and the
  step's real forwards, in the same autocast region, reuse them: no gradient reaches the
  weights, and the first step of a mixed-precision pipeline silently trains nothing. A
  mended stage infers its shapes with that cache off.
- After the backward the stage divides each gradient by the number of micro-batches in place
  (``scale_grads``), and torch 2.9's DTensor leaves an in-place division of a
  ``Partial(sum)`` DTensor undone: the gradients of weights that tensor parallel keeps whole
  while their inputs are split (the norms of sequence parallel) stay summed over the
  micro-batches, a step that many times too large. A mended stage divides the local tensors
  (right for every placement: a division by a number commutes with the sum).
- ``schedule.step`` takes no ``return_outputs`` (it always returns the last stage's merged
  outputs, and any other keyword goes to the first stage's forward): `step_keywords` passes
  it only where the schedule accepts it.

Later torch releases (the locked 2.15 among them) dropped the handshake, infer shapes with
gradients on and divide a ``Partial`` DTensor in place; there a stage is left as it is.
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
    mended on torch 2.9 (`mend_pipeline_stage`)."""
    from torch.distributed.pipelining import PipelineStage

    return mend_pipeline_stage(PipelineStage(module, index, num_stages, device, group=group))


# torch 2.9's (gone later): where a stage has them, it is mended
_MENDED = ("_get_init_p2p_neighbors_ops", "_shape_inference")


def mend_pipeline_stage(stage: Any) -> Any:
    """`stage`, a stage of `torch.distributed.pipelining` (``PipelineStage``, or what
    ``pipeline(...).build_stage`` made), with torch 2.9's handshake, shape inference and
    gradient scaling mended (see the module docstring); on later torch, `stage` as it is."""
    if any(hasattr(stage, name) for name in _MENDED):
        stage.__class__ = _mended_class(type(stage))
    return stage


@functools.cache
def _mended_class(base: type) -> type:
    """`base` with the three methods mended (one class per stage class)."""
    import torch.distributed as dist

    class MendedStage(base):  # type: ignore[misc, valid-type]
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

    MendedStage.__name__ = MendedStage.__qualname__ = f"Mended{base.__name__}"
    return MendedStage


def step_keywords(schedule: Any) -> dict[str, Any]:
    """The keywords of a training ``schedule.step`` beyond the inputs, target and losses:
    ``return_outputs=False`` (the outputs of a training step are not used) where accepted."""
    return {"return_outputs": False} if _accepts_return_outputs(type(schedule)) else {}


@functools.cache
def _accepts_return_outputs(cls: type) -> bool:
    return "return_outputs" in inspect.signature(cls.step).parameters
