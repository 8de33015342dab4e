"""The Accelerator's device-mesh surface: the mesh, the rank along each dimension, and the
context-parallel block. The mesh and its strategy live in accel-parallel; these only ask."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class MeshMixin:
    """accelerate's names for the `ParallelismConfig` mesh (see accel_parallel)."""

    parallelism_config: Any
    strategy: Any
    device: torch.device

    @property
    def torch_device_mesh(self) -> Any:
        """The run's DeviceMesh (accelerate's dimension names), None without a
        ParallelismConfig or on one process."""
        if self.parallelism_config is None:
            return None
        return self.parallelism_config.get_device_mesh(self.device.type)

    def _mesh_rank(self, dim: str) -> int:
        from accel_parallel import mesh_local_rank

        return mesh_local_rank(self.parallelism_config, self.torch_device_mesh, dim)

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's rank in its tensor-parallel group (0 when tp_size is 1)."""
        return self._mesh_rank("tp")

    @property
    def context_parallel_rank(self) -> int:
        """This process's rank in its context-parallel group (0 when cp_size is 1)."""
        return self._mesh_rank("cp")

    @property
    def data_parallel_rank(self) -> int:
        """accelerate's meaning: the rank along ``dp_replicate`` (0 when it is 1)."""
        return self._mesh_rank("dp_replicate")

    @property
    def data_parallel_shard_rank(self) -> int:
        """The rank along ``dp_shard`` (0 when it is 1)."""
        return self._mesh_rank("dp_shard")

    @property
    def pipeline_parallel_rank(self) -> int:
        """This process's pipeline stage rank (0 when pp_size is 1)."""
        return self._mesh_rank("pp")

    @property
    def should_save_model(self) -> bool:
        return True

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any = None) -> Any:
        """`dl`, prepared in another call than the model, split along the sequence as
        `prepare` splits the loaders it prepares with the model under DeepSpeed's sequence
        parallel (``sp_size > 1``); `dl` itself otherwise."""
        return self.strategy.sequence_loader(dl)

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Inside the block, `buffers` are split along `buffer_seq_dims` over the ``cp``
        mesh and SDPA runs as ring attention (CUDA only); a no-op without context parallel."""
        return self.strategy.context_parallel(buffers, buffer_seq_dims, no_restore_buffers)
