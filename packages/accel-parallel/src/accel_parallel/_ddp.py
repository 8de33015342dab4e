"""DistributedDataParallel: replicate the model, all-reduce gradients, `no_sync` to accumulate."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy
from accel_state import device_entry


class DDPCommunicationHookType(str, enum.Enum):
    """Gradient communication hooks (torch.distributed.algorithms.ddp_comm_hooks).

    Note: in torch 2.15 the batched PowerSGD hook raises an AssertionError as soon as it
    starts compressing (after ``start_powerSGD_iter`` steps); plain PowerSGD works.
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclasses.dataclass
class DistributedDataParallelKwargs:
    """Arguments for `torch.nn.parallel.DistributedDataParallel` and its communication hook.

    ``comm_wrapper`` (fp16 or bf16) compresses what a PowerSGD hook sends;
    ``comm_state_option`` goes to ``PowerSGDState`` (e.g. ``{"matrix_approximation_rank": 2}``).
    The fields are accelerate's, in its order; they may be assigned after creation (a hook
    given as a string, or as accelerate's enum, is turned into `DDPCommunicationHookType`).
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: float = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType | str = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("comm_hook", "comm_wrapper"):
            value = _hook_type(name, value)
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        if self.comm_wrapper not in (
            DDPCommunicationHookType.NO,
            DDPCommunicationHookType.FP16,
            DDPCommunicationHookType.BF16,
        ):
            raise ValueError(
                f"comm_wrapper={self.comm_wrapper.value!r}: a wrapper compresses another hook's "
                f"traffic and must be 'fp16' or 'bf16' (or 'no')."
            )
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb={self.bucket_cap_mb}: must be positive.")

    def ddp_arguments(self) -> dict[str, Any]:
        """The keyword arguments DistributedDataParallel itself takes.

        `broadcast_buffers` is passed only when turned off: recent torch deprecates the
        argument but has no other way to keep buffers rank-local.
        """
        optional = {} if self.broadcast_buffers else {"broadcast_buffers": False}
        return {
            **optional,
            "dim": self.dim,
            "bucket_cap_mb": self.bucket_cap_mb,
            "find_unused_parameters": self.find_unused_parameters,
            "check_reduction": self.check_reduction,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "static_graph": self.static_graph,
        }


def _hook_type(field: str, value: Any) -> DDPCommunicationHookType:
    """A hook type from its value ("fp16"), or from an enum member of another library whose
    value is one (accelerate's `DDPCommunicationHookType.FP16`)."""
    try:
        return DDPCommunicationHookType(getattr(value, "value", value))
    except ValueError:
        accepted = [h.value for h in DDPCommunicationHookType]
        raise ValueError(
            f"DistributedDataParallelKwargs.{field}={value!r}: expected one of {accepted}."
        ) from None


def register_comm_hook(
    model: nn.parallel.DistributedDataParallel, kwargs: DistributedDataParallelKwargs
) -> None:
    """Register the communication hook that `kwargs` asks for on a DDP model."""
    hook_type = DDPCommunicationHookType(kwargs.comm_hook)
    if hook_type is DDPCommunicationHookType.NO:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook_type is DDPCommunicationHookType.FP16:
        model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
        return
    if hook_type is DDPCommunicationHookType.BF16:
        model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)
        return
    if hook_type is DDPCommunicationHookType.POWER_SGD:
        hook = powerSGD_hook.powerSGD_hook
    else:
        _orthogonalize_accepts_one_matrix(powerSGD_hook)
        hook = powerSGD_hook.batched_powerSGD_hook
    wrapper = DDPCommunicationHookType(kwargs.comm_wrapper)
    if wrapper is DDPCommunicationHookType.FP16:
        hook = default_hooks.fp16_compress_wrapper(hook)
    elif wrapper is DDPCommunicationHookType.BF16:
        hook = default_hooks.bf16_compress_wrapper(hook)
    state = powerSGD_hook.PowerSGDState(process_group=None, **kwargs.comm_state_option)
    model.register_comm_hook(state=state, hook=hook)


def _orthogonalize_accepts_one_matrix(module: Any) -> None:
    """Let torch's batched PowerSGD hook pass its warm-up.

    After `start_powerSGD_iter` steps the batched hook orthogonalizes one 2-D matrix, but the
    orthogonalization it calls accepts only a 3-D batch of matrices and raises an
    AssertionError (torch 2.x). A 2-D matrix is orthogonalized as a batch of one, in place,
    which is what the hook means; 3-D input goes to torch's function unchanged.
    """
    original = module._orthogonalize
    if getattr(original, "_accel_accepts_2d", False):
        return

    def orthogonalize(matrices: torch.Tensor, epsilon: float = 0) -> None:
        if matrices.dim() == 2:
            matrices = matrices.unsqueeze(0)  # a view: the result lands in the caller's tensor
        original(matrices, epsilon=epsilon)

    orthogonalize._accel_accepts_2d = True  # type: ignore[attr-defined]
    module._orthogonalize = orthogonalize


class DDPStrategy(Strategy):
    """Data parallel over all processes with torch's DistributedDataParallel."""

    name = "ddp"
    supports_no_sync = True
    reshardable = True  # full (replicated) states: they load on any number of processes

    def __init__(
        self,
        info: ProcessInfo,
        kwargs: DistributedDataParallelKwargs | None = None,
        *,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(info, clip_norm=clip_norm)
        self.kwargs = kwargs or DistributedDataParallelKwargs()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = self.move_model(model)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronize (e.g. a frozen teacher model)
        # DDP names the device of a module on one GPU; none for CPU or multi-device modules
        devices = {p.device for p in model.parameters()}
        only = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")
        device_ids = None if device_entry(only).is_host else [only.index or 0]
        wrapped = nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=device_ids[0] if device_ids else None,
            **self.kwargs.ddp_arguments(),
        )
        register_comm_hook(wrapped, self.kwargs)
        return wrapped

    def memory_engine(self) -> tuple[str, dict[str, Any]]:
        return "ddp", {"activation_checkpointing": False}

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Inside `no_sync`, make the next backward all-reduce anyway (e.g. the last micro-step
        of a region that was entered without knowing it would be the last)."""
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            yield
            return
        saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    def join(
        self, joinables: list[Any], *, enable: bool
    ) -> contextlib.AbstractContextManager[None]:
        """torch's `Join` over `joinables` (the prepared DDP models and optimizers): a process
        that ran out of batches shadows the others' collectives instead of hanging them."""
        from torch.distributed.algorithms.join import Join

        return Join(joinables, enable=enable, throw_on_early_termination=False)


def _build(request: StrategyRequest) -> DDPStrategy:
    return DDPStrategy(request.info, request.ddp_kwargs, clip_norm=request.clip_norm)


register_strategy(
    DDPStrategy.name, _build, claims=lambda request: 10 if request.info.num_processes > 1 else None
)
