"""The strategy for a `ParallelismConfig` mesh: tensor parallel on ``tp``, then FSDP2 over
the data-parallel dimensions (``dp_shard_cp``, with ``dp_replicate`` outside it for HSDP).

Both steps are plain functions of the model and a sub-mesh: `apply_tensor_parallel`, and the
sharder the strategy holds (an `FSDP2Sharder` over the data-parallel sub-mesh, or
`NoSharding` where the mesh does not shard). Re-pointing optimizers, clipping and the DCP
checkpoints of DTensors are `DTensorStrategy`'s, which the FSDP2 strategy shares. Data-parallel
size, rank and group come from the mesh, so loaders, metrics and schedulers count
data-parallel replicas.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accel_parallel._dtensor_strategy import DTensorStrategy
from accel_parallel._fsdp import plugin_for
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._fsdp_sharder import FSDP2Sharder, NoSharding
from accel_parallel._parallelism_config import ParallelismConfig
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo
from accel_parallel._tp import apply_tensor_parallel


class MeshView:
    """The device mesh of a `ParallelismConfig` as a strategy reads it: the whole mesh, the
    sub-mesh FSDP2 shards over, and the data-parallel size, rank and group (what loaders,
    metrics and schedulers count). The mesh and pipeline strategies each hold one."""

    def __init__(self, config: ParallelismConfig, device: torch.device) -> None:
        self.config = config
        self.device_type = device.type

    @property
    def device_mesh(self) -> Any:
        return self.config.get_device_mesh(self.device_type)

    def fsdp_mesh(self) -> Any:
        """The sub-mesh FSDP2 shards over (2-D for HSDP)."""
        return self.config.fsdp_mesh(self.device_type)

    def sub_mesh(self, name: str) -> Any:
        return self.config.sub_mesh(name, self.device_type)

    @property
    def data_parallel_size(self) -> int:
        return self.config.data_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        return mesh_local_rank(self.config, self.device_mesh, "dp")

    def data_parallel_group(self) -> Any:
        if not self.config.dp_dim_names:
            return None
        return self.sub_mesh("dp").get_group()


def check_mesh_run(
    config: ParallelismConfig, plugin: FullyShardedDataParallelPlugin, device: torch.device
) -> None:
    """Refuse what a device-mesh run cannot do."""
    from accel_state import device_entry  # (ring attention needs CUDA's SDPA kernels)

    if config.cp_enabled and not device_entry(device).ring_attention:
        raise ValueError(
            f"ParallelismConfig(cp_size={config.cp_size}): context parallel runs torch's "
            f"ring attention, which needs the CUDA SDPA kernels; this run is on "
            f"{device.type!r}. Run on CUDA GPUs, or set cp_size=1."
        )
    if plugin.cpu_ram_efficient_loading:
        raise ValueError(
            "cpu_ram_efficient_loading=True is not supported with a ParallelismConfig mesh; "
            "set it to False (every rank loads the weights, then they are split)."
        )


class OnMeshView:
    """What a strategy that holds a `MeshView` as ``self.layout`` reports of it: the whole
    mesh and the data-parallel size, rank and group (the mesh and pipeline strategies)."""

    layout: MeshView

    @property
    def device_mesh(self) -> Any:
        return self.layout.device_mesh

    @property
    def data_parallel_size(self) -> int:
        return self.layout.data_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        return self.layout.data_parallel_rank

    def data_parallel_group(self) -> Any:
        return self.layout.data_parallel_group()


class MeshStrategy(OnMeshView, DTensorStrategy):
    """Tensor parallel, then FSDP2 (or HSDP) over the one device mesh of `config`:
    `apply_tensor_parallel` on the ``tp`` sub-mesh first, then the sharder it holds over the
    data-parallel sub-mesh (`NoSharding` for tensor parallel alone); DTensor state and
    checkpoints as FSDP2's."""

    supports_no_sync = True

    def __init__(
        self,
        info: ProcessInfo,
        config: ParallelismConfig,
        plugin: FullyShardedDataParallelPlugin | None = None,
        mixed_precision: str = "no",
        *,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(info, plugin, mixed_precision, clip_norm=clip_norm)
        self.config = config
        self.layout = MeshView(config, info.device)
        shards = config.dp_shard_enabled or config.cp_enabled
        self.sharder: FSDP2Sharder | NoSharding = (
            FSDP2Sharder(self.plugin, mixed_precision, self.layout.fsdp_mesh)
            if shards
            else NoSharding()
        )
        self.name = "fsdp" if shards else "tp"  # for messages, as accelerate names the run
        check_mesh_run(config, self.plugin, info.device)

    @property
    def fsdp_plugin(self) -> FullyShardedDataParallelPlugin | None:
        return self.sharder.plugin  # tensor parallel alone runs no FSDP2

    def distributed_type(self, topology: Any) -> Any:
        return self.sharder.distributed_type(topology)

    # -- preparing -------------------------------------------------------------------------------
    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return model
        model = self.move_model(model)
        self.parallelize(model)
        return model

    def parallelize(self, model: nn.Module) -> None:
        """Tensor parallel on the ``tp`` sub-mesh, then the sharder over the data-parallel
        one (each where the mesh has it), in place."""
        if self.config.tp_enabled:
            handler = self.config.tp_handler
            apply_tensor_parallel(
                model,
                self.layout.sub_mesh("tp"),
                self.config.tp_plan,
                enable_async_tp=bool(handler and handler.enable_async_tp),
                sequence_parallel=bool(handler and handler.sequence_parallel),
            )
        self.sharder.shard(model)

    def memory_engine(self) -> tuple[str, dict[str, Any]] | None:
        """FSDP2's estimate where the mesh only shards; a mesh that also splits tensors,
        replicates or splits the sequence is not estimated at prepare."""
        config = self.config
        if config.tp_enabled or config.cp_enabled or config.dp_replicate_size > 1:
            return None
        return self.sharder.memory_engine()

    # -- the step ----------------------------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self.sharder.no_sync(model)

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self.sharder.sync_in_backward(model)

    # -- context parallel ---------------------------------------------------------------------------
    def context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        return context_parallel(
            self.config, self.device_mesh, buffers, buffer_seq_dims, no_restore_buffers
        )


def mesh_request(request: StrategyRequest) -> tuple[ParallelismConfig, Any]:
    """(config, FSDP plugin) of a run on the device mesh; refuses what cannot join it."""
    config = request.parallelism_config
    if request.deepspeed_plugin is not None or request.launched_type == "DEEPSPEED":
        raise ValueError(
            f"ParallelismConfig(dp_shard_size={config.dp_shard_size}, tp_size={config.tp_size}, "
            f"cp_size={config.cp_size}, pp_size={config.pp_size}) runs on the FSDP2 device mesh, "
            f"not on DeepSpeed; drop the DeepSpeed plugin or the ParallelismConfig."
        )
    if request.ddp_kwargs is not None:
        raise ValueError(
            "DistributedDataParallelKwargs apply to DDP, and this ParallelismConfig runs FSDP2 / "
            "tensor parallel over a device mesh; drop the DDP kwargs handler (or use only "
            "dp_replicate_size for DDP)."
        )
    return config, plugin_for(request)


def _splits(request: StrategyRequest) -> bool:
    config = request.parallelism_config
    return config is not None and (
        config.dp_shard_enabled or config.tp_enabled or config.cp_enabled
    )


def _build(request: StrategyRequest) -> MeshStrategy:
    if not _splits(request) or request.parallelism_config.pp_enabled:
        raise ValueError(
            f"strategy 'mesh' runs a ParallelismConfig that shards or splits tensors "
            f"(dp_shard_size, tp_size or cp_size > 1, pp_size 1); this run has "
            f"{request.parallelism_config!r}. Pass such a config, or another strategy."
        )
    config, plugin = mesh_request(request)
    return MeshStrategy(
        request.info, config, plugin, request.mixed_precision, clip_norm=request.clip_norm
    )


register_strategy(
    "mesh",
    _build,
    claims=lambda r: 50 if _splits(r) and not r.parallelism_config.pp_enabled else None,
)


def mesh_local_rank(config: ParallelismConfig | None, mesh: Any, dim: str) -> int:
    """This process's rank along `dim` of the mesh (0 when the dimension is not split)."""
    if config is None:
        raise RuntimeError(
            f"the {dim} rank exists only with a ParallelismConfig; pass "
            f"Accelerator(parallelism_config=ParallelismConfig(...))."
        )
    parts = {"dp": config.dp_dim_names, "dp_shard_cp": config.dp_shard_cp_dim_names,
             "dp_cp": config.dp_cp_dim_names}.get(dim, [dim])  # fmt: skip
    if mesh is None or not all(getattr(config, f"{p}_size") > 1 for p in parts) or not parts:
        return 0
    return config.sub_mesh(dim).get_local_rank()


@contextlib.contextmanager
def context_parallel(
    config: ParallelismConfig | None,
    mesh: Any,
    buffers: list[torch.Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> Iterator[None]:
    """Split `buffers` (inputs, labels, position ids...) along their sequence dimension over
    the ``cp`` mesh, and run SDPA as torch's ring attention inside the block. Does nothing
    without context parallel."""
    if config is None or not config.cp_enabled:
        yield
        return
    if mesh.device_type != "cuda":
        raise ValueError(
            f"context parallel needs CUDA (torch's ring attention); the mesh is on "
            f"{mesh.device_type!r}. Run on CUDA GPUs, or set cp_size=1."
        )
    from torch.distributed.tensor.experimental import context_parallel as torch_cp
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(config.cp_handler.cp_comm_strategy)
    with torch_cp(
        config.sub_mesh("cp"),
        buffers=buffers,
        buffer_seq_dims=buffer_seq_dims,
        no_restore_buffers=no_restore_buffers,
    ):
        yield
