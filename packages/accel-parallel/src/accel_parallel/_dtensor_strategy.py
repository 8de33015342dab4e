"""The state of a model whose parameters are DTensors (FSDP2's shards, tensor parallel's
splits): clipping by the global norm over every shard, full and sharded state dicts, and
checkpoint files through `torch.distributed.checkpoint` (SHARDED_STATE_DICT) or a full file
(FULL_STATE_DICT).

`DTensorStrategy` is not a registered strategy: the FSDP2 and mesh strategies build on it,
and each holds the sharder it applies (`accel_parallel._fsdp_sharder`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_parallel import _dtensor
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._io import save_object
from accel_parallel._strategy import ProcessInfo, Strategy, prepared_with
from accel_parallel.checkpoint import _dcp
from accel_parallel.checkpoint._formats import FULL
from accel_parallel.checkpoint._layout import (
    fsdp_model_file,
    fsdp_model_folder,
    fsdp_optimizer_folder,
)


class DTensorStrategy(Strategy):
    """Prepare (optimizers re-pointed at the new parameters), clip, state and files of a model
    whose parameters `parallelize` made DTensors; an engine supplies `parallelize`."""

    sharded = True  # every rank must agree on an fp16 overflow (a ShardedGradScaler)
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
        self._optimizer_models: dict[int, nn.Module] = {}
        self._writer = _dcp.DCPWriter()

    # -- preparing -----------------------------------------------------------------------
    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if self.info.process_index == 0:
            self.plugin.warn_notices()
        wrapped, trained = _dtensor.repoint_optimizers(models, optimizers, self.wrap_model)
        self._optimizer_models.update(trained)
        return wrapped, optimizers

    def parallelize(self, model: nn.Module) -> None:
        """The engine applied to `model` in place, where it is (`wrap_model` has moved it)."""
        raise NotImplementedError

    # -- the step --------------------------------------------------------------------------
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
