"""What an engine holds to shard a model's parameters over data-parallel ranks.

`FSDP2Sharder` applies FSDP2 (activation checkpointing with the plugin's, then `apply_fsdp`
over the sub-mesh it is given) and owns what FSDP2 changes in a step (`no_sync`, the
DistributedType, the memory estimate); `NoSharding` stands in for it where a device mesh does
not shard (tensor parallel alone). The FSDP2 strategy holds one over every process, the mesh
strategy one over its data-parallel sub-mesh, as torchtitan's parallelize functions take the
meshes of its ParallelDims.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._parallelize import (
    apply_activation_checkpointing,
    apply_fsdp,
    fsdp_units,
    ignored_parameters,
)


class FSDP2Sharder:
    """FSDP2 with `plugin`'s settings over the mesh `mesh()` returns (made on first use)."""

    def __init__(
        self,
        plugin: FullyShardedDataParallelPlugin,
        mixed_precision: str,
        mesh: Callable[[], Any],
    ) -> None:
        self.plugin = plugin
        self.mixed_precision = mixed_precision
        self._mesh = mesh

    def shard(self, model: nn.Module) -> None:
        """Activation checkpointing (with the plugin's) and FSDP2 over the mesh, in place."""
        plugin = self.plugin
        units = fsdp_units(model, plugin)
        if plugin.activation_checkpointing:
            apply_activation_checkpointing(model, units)
        apply_fsdp(
            model,
            units,
            self._mesh(),
            plugin,
            self.mixed_precision,
            ignored=ignored_parameters(model, plugin),
        )

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

    def distributed_type(self, topology: Any) -> Any:
        from accel_state import DistributedType

        return DistributedType.FSDP

    def memory_engine(self) -> tuple[str, dict[str, Any]] | None:
        """FSDP2's estimate (`accel_parallel.memory`) with the plugin's settings."""
        plugin = self.plugin
        return "fsdp2", {
            "reshard_after_forward": bool(plugin.reshard_after_forward),
            "offload": bool(plugin.cpu_offload),
            "activation_checkpointing": bool(plugin.activation_checkpointing),
        }


class NoSharding:
    """The sharder of a mesh that does not shard over data-parallel ranks: nothing is
    sharded, no gradient is synchronized, accelerate reports the process topology."""

    plugin: FullyShardedDataParallelPlugin | None = None

    def shard(self, model: nn.Module) -> None:
        """Nothing to shard."""

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def distributed_type(self, topology: Any) -> Any:
        return topology

    def memory_engine(self) -> tuple[str, dict[str, Any]] | None:
        return None
