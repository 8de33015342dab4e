"""FSDP2: parameters sharded over the processes with `torch.distributed.fsdp.fully_shard`.

Each unit (chosen by the plugin's auto-wrap policy) and the root become FSDP modules whose
parameters are DTensors sharded on dim 0 (`accel_parallel._parallelize.apply_fsdp`). Sharding
replaces the parameters, so the optimizers of the same `prepare` call are re-pointed at the
new ones. Checkpoints go through `torch.distributed.checkpoint`: sharded (each process writes
its shard; loads on any number of processes) or full (gathered, written once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_parallel import _dtensor
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._io import save_object
from accel_parallel._parallelize import (
    apply_activation_checkpointing,
    apply_fsdp,
    fsdp_units,
    ignored_parameters,
)
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy, prepared_with
from accel_parallel.checkpoint import _dcp
from accel_parallel.checkpoint._formats import FULL
from accel_parallel.checkpoint._layout import (
    fsdp_model_file,
    fsdp_model_folder,
    fsdp_optimizer_folder,
)


class FSDP2Strategy(Strategy):
    """`fully_shard` over all processes (a 1-D mesh); see the module docstring."""

    name = "fsdp"
    supports_no_sync = True
    sharded = True  # fp16 needs a ShardedGradScaler
    reshardable = True  # sharded checkpoints load on another number of processes

    def __init__(
        self,
        info: ProcessInfo,
        plugin: FullyShardedDataParallelPlugin | None = None,
        mixed_precision: str = "no",
        *,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(info, clip_norm=clip_norm)
        self.plugin = plugin or FullyShardedDataParallelPlugin()
        self.mixed_precision = mixed_precision
        self._mesh: Any = None
        self._optimizer_models: dict[int, nn.Module] = {}
        self._writer = _dcp.DCPWriter()

    @property
    def fsdp_plugin(self) -> FullyShardedDataParallelPlugin | None:
        return self.plugin

    def distributed_type(self, topology: Any) -> Any:
        from accel_state import DistributedType

        return DistributedType.FSDP

    def memory_engine(self) -> tuple[str, dict[str, Any]]:
        plugin = self.plugin
        return "fsdp2", {
            "reshard_after_forward": bool(plugin.reshard_after_forward),
            "offload": bool(plugin.cpu_offload),
            "activation_checkpointing": bool(plugin.activation_checkpointing),
        }

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

    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if self.info.process_index == 0:
            self.plugin.warn_notices()
        wrapped, trained = _dtensor.repoint_optimizers(models, optimizers, self.wrap_model)
        self._optimizer_models.update(trained)
        return wrapped, optimizers

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
        """The engine applied to `model` in place, where it is (`wrap_model` has moved it):
        FSDP2's sharding here, tensor parallel first on a device mesh."""
        self.shard(model)

    def shard(self, model: nn.Module) -> None:
        """Activation checkpointing (with the plugin's) and FSDP2 over this strategy's mesh."""
        units = fsdp_units(model, self.plugin)
        if self.plugin.activation_checkpointing:
            apply_activation_checkpointing(model, units)
        apply_fsdp(
            model,
            units,
            self._device_mesh(),
            self.plugin,
            self.mixed_precision,
            ignored=ignored_parameters(model, self.plugin),
        )

    def _broadcast_from_rank0(self, model: nn.Module, full_state: dict | None) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if any(t.device.type == "meta" for t in model.state_dict().values()):
            device = "cpu" if self.plugin.cpu_offload else self.device
            model.to_empty(device=device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full_state or {}, options=options)

    # -- the step --------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Accumulate unsharded gradients locally: no reduce-scatter until the block ends."""
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        model.set_requires_gradient_sync(True)
        yield

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the global norm over every shard; returns that norm (a plain tensor)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        total = _dtensor.grad_norm(grads, norm_type, self.device)
        _dtensor.scale_gradients(grads, total, max_norm)
        return total

    def clip_grad_value_(self, parameters: Iterable[nn.Parameter], clip_value: float) -> None:
        _dtensor.clip_grad_value(parameters, clip_value)

    # -- state -------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict on the main process (CPU tensors); other processes get {}."""
        return _dtensor.full_model_state(model)

    def load_model_state_dict(
        self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> Any:
        """Load a full state dict (given on every process, or on rank 0 only: then broadcast)."""
        return _dtensor.load_full_model_state(model, state_dict, self.device, strict=strict)

    def _model_for(self, optimizer: torch.optim.Optimizer, model: nn.Module | None) -> nn.Module:
        return prepared_with(self._optimizer_models, optimizer, model, "an FSDP2 model")

    optimizer_model = _model_for

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """The full optimizer state keyed by parameter names, on the main process."""
        return _dtensor.full_optimizer_state(self._model_for(optimizer, model), optimizer)

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        model: nn.Module | None = None,
    ) -> None:
        _dtensor.load_full_optimizer_state(self._model_for(optimizer, model), optimizer, state_dict)

    def gradients_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This process's shard of the accumulated gradients (restored on the same layout)."""
        return _dtensor.local_gradients(model)

    def load_gradients_state(self, model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
        _dtensor.load_local_gradients(model, grads)

    # -- files: the DCP format (SHARDED_STATE_DICT) or FSDP2's full file (FULL_STATE_DICT) ---
    def _sharded(self) -> bool:
        return self.plugin.state_dict_type == "SHARDED_STATE_DICT"

    def save_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        writer: bool,
        write_full: Callable[[dict[str, torch.Tensor], Path], None],
    ) -> None:
        if not self._sharded():
            state = self.model_state_dict(model)
            if writer:
                save_object(state, directory / fsdp_model_file(name))
            return
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        self._writer.save(
            {"model": get_model_state_dict(model)}, directory / fsdp_model_folder(name)
        )

    def load_full_model(
        self,
        model: nn.Module,
        read: Callable[[], dict[str, torch.Tensor]],
        kind: str,
        strict: bool = True,
    ) -> None:
        """FSDP2's own full file is read on the main process only and broadcast; a full copy
        another run wrote is read by every process."""
        import torch.distributed as dist

        state = read() if kind == FULL or dist.get_rank() == 0 else {}
        self.load_model_state_dict(model, state, strict=strict)

    def load_model_folder(self, model: nn.Module, folder: Path, strict: bool = True) -> None:
        _dcp.load_sharded_model(model, folder, strict=strict)

    def save_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        *,
        writer: bool,
        model: nn.Module | None = None,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model = self._model_for(optimizer, model)
        if not self._sharded():
            super().save_optimizer_files(optimizer, directory, name, writer=writer, model=model)
            return
        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        self._writer.save(state, directory / fsdp_optimizer_folder(name))


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
