"""FSDP2: parameters sharded over the processes with `torch.distributed.fsdp.fully_shard`.

Each unit (chosen by the plugin's auto-wrap policy) and the root become FSDP modules whose
parameters are DTensors sharded on dim 0: the strategy holds an `FSDP2Sharder` over a 1-D mesh
of every process, which applies `accel_parallel._parallelize.apply_fsdp`. Sharding replaces
the parameters, so the optimizers of the same `prepare` call are re-pointed at the new ones.
Checkpoints go through `torch.distributed.checkpoint`: sharded (each process writes its shard;
loads on any number of processes) or full (gathered, written once); that part, shared with the
mesh strategy, is `accel_parallel._dtensor_strategy.DTensorStrategy`'s.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn

from accel_parallel._dtensor_strategy import DTensorStrategy
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._fsdp_sharder import FSDP2Sharder
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo


class FSDP2Strategy(DTensorStrategy):
    """`fully_shard` over all processes (a 1-D mesh), through the `FSDP2Sharder` it holds;
    see the module docstring."""

    name = "fsdp"
    supports_no_sync = True

    def __init__(
        self,
        info: ProcessInfo,
        plugin: FullyShardedDataParallelPlugin | None = None,
        mixed_precision: str = "no",
        *,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(info, plugin, mixed_precision, clip_norm=clip_norm)
        self._mesh: Any = None
        self.sharder = FSDP2Sharder(self.plugin, mixed_precision, self._device_mesh)

    @property
    def fsdp_plugin(self) -> FullyShardedDataParallelPlugin | None:
        return self.plugin

    def distributed_type(self, topology: Any) -> Any:
        return self.sharder.distributed_type(topology)

    def memory_engine(self) -> tuple[str, dict[str, Any]] | None:
        return self.sharder.memory_engine()

    # -- preparing -----------------------------------------------------------------------
    def _device_mesh(self) -> Any:
        """The mesh FSDP2 shards over: every process, on one dimension."""
        if self._mesh is None:
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            if not dist.is_initialized():  # one process: a group of one, so DCP and FSDP work
                from accel_state import device_entry  # nccl where that is the device's backend

                backend = (
                    "nccl" if device_entry(self.device).default_backend() == "nccl" else "gloo"
                )
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self._mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))
        return self._mesh

    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return model
        efficient = self.plugin.cpu_ram_efficient_loading
        full_state = None
        if efficient:
            full_state = model.state_dict() if self.info.process_index == 0 else None
        elif any(p.device.type == "meta" for p in model.parameters()):
            raise ValueError(
                "The model has parameters on the meta device; load its weights before prepare(), "
                "or use FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True) with "
                "the weights on rank 0."
            )
        if not efficient:
            model = model.to(self.device)
        self.parallelize(model)
        if efficient:
            self._broadcast_from_rank0(model, full_state)
        return model

    def parallelize(self, model: nn.Module) -> None:
        """FSDP2 applied to `model` in place, where it is (`wrap_model` has moved it)."""
        self.sharder.shard(model)

    def _broadcast_from_rank0(self, model: nn.Module, full_state: dict | None) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if any(t.device.type == "meta" for t in model.state_dict().values()):
            device = "cpu" if self.plugin.cpu_offload else self.device
            model.to_empty(device=device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full_state or {}, options=options)

    # -- the step --------------------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Accumulate unsharded gradients locally: no reduce-scatter until the block ends."""
        return self.sharder.no_sync(model)

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self.sharder.sync_in_backward(model)


def plugin_for(request: StrategyRequest) -> FullyShardedDataParallelPlugin:
    """The request's FSDP plugin, else one from the `accel launch` fsdp_config section."""
    if request.fsdp_plugin is not None:
        return request.fsdp_plugin
    return FullyShardedDataParallelPlugin.from_launch_config(request.launch_section("fsdp_config"))


def _build(request: StrategyRequest) -> FSDP2Strategy:
    return FSDP2Strategy(
        request.info,
        plugin_for(request),
        mixed_precision=request.mixed_precision,
        clip_norm=request.clip_norm,
    )


def _claims(request: StrategyRequest) -> int | None:
    if request.fsdp_plugin is not None:
        return 40
    return 20 if request.launched_type == "FSDP" else None


register_strategy(FSDP2Strategy.name, _build, claims=_claims)
