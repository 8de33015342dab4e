"""Choose the strategy once, from the run's configuration: the one place that decides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel_parallel._ddp import DDPStrategy, DistributedDataParallelKwargs
from accel_parallel._single import SingleDeviceStrategy
from accel_parallel._strategy import ProcessInfo, Strategy

_KNOWN = ("single_device", "ddp", "fsdp", "deepspeed")
_LAUNCH_TYPES = {"FSDP": "fsdp", "DEEPSPEED": "deepspeed"}


def select_strategy(
    info: ProcessInfo,
    *,
    name: str | None = None,
    ddp_kwargs: DistributedDataParallelKwargs | None = None,
    fsdp_plugin: Any = None,
    deepspeed_plugin: Any = None,
    launch_config: Mapping[str, Any] | None = None,
    mixed_precision: str = "no",
    parallelism_config: Any = None,
    **options: Any,
) -> Strategy:
    """The strategy for this run.

    Strongest first: `name`; a plugin (`fsdp_plugin` -> FSDP2, `deepspeed_plugin` ->
    DeepSpeed); the `accel launch` configuration (`distributed_type: FSDP` with its
    `fsdp_config` section, `distributed_type: DEEPSPEED` with its `deepspeed_config`); else DDP with several processes and a single device with one.
    `mixed_precision` is the run's mode (FSDP2 derives its parameter dtype from it).
    A `parallelism_config` that shards, splits tensors or contexts gives the mesh strategy
    (FSDP2 with the fsdp plugin's settings, over its data-parallel dimensions); one with
    ``pp_size > 1`` the pipeline strategy (stages over ``pp``; tensor parallel and FSDP2
    inside each stage).
    """
    if options:
        raise TypeError(f"select_strategy got unknown options {sorted(options)}.")
    launch = dict(launch_config or {})
    launched = _LAUNCH_TYPES.get(str(launch.get("distributed_type", "")).upper())
    if name is None:
        if fsdp_plugin is not None and deepspeed_plugin is not None:
            raise ValueError("Pass fsdp_plugin or deepspeed_plugin, not both.")
        if fsdp_plugin is not None:
            name = "fsdp"
        elif deepspeed_plugin is not None:
            name = "deepspeed"
        else:
            name = launched or ("ddp" if info.num_processes > 1 else "single_device")
    if parallelism_config is not None:
        mesh = _mesh_strategy(info, name, parallelism_config, fsdp_plugin, launch, mixed_precision)
        if mesh is not None:
            if ddp_kwargs is not None:
                raise ValueError(
                    "DistributedDataParallelKwargs apply to DDP, and this ParallelismConfig "
                    "runs FSDP2 / tensor parallel over a device mesh; drop the DDP kwargs "
                    "handler (or use only dp_replicate_size for DDP)."
                )
            return mesh
    if name == "single_device":
        if info.num_processes > 1:
            raise ValueError(
                f"strategy 'single_device' cannot run {info.num_processes} processes; use 'ddp'."
            )
        return SingleDeviceStrategy(info)
    if name == "ddp":
        return DDPStrategy(info, ddp_kwargs)
    if name == "fsdp":
        from accel_parallel._fsdp import FSDP2Strategy
        from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin

        if fsdp_plugin is None:
            fsdp_plugin = FullyShardedDataParallelPlugin.from_launch_config(
                launch.get("fsdp_config") or {}
            )
        return FSDP2Strategy(info, fsdp_plugin, mixed_precision=mixed_precision)
    if name == "deepspeed":
        from accel_parallel._deepspeed import DeepSpeedStrategy
        from accel_parallel._deepspeed_plugin import DeepSpeedPlugin

        if deepspeed_plugin is None:
            deepspeed_plugin = DeepSpeedPlugin.from_launch_config(
                launch.get("deepspeed_config") or {}
            )
        return DeepSpeedStrategy(info, deepspeed_plugin, mixed_precision=mixed_precision)
    raise ValueError(f"Unknown strategy {name!r}; expected one of {list(_KNOWN)}.")


def _mesh_strategy(
    info: ProcessInfo,
    name: str,
    config: Any,
    fsdp_plugin: Any,
    launch: Mapping[str, Any],
    mixed_precision: str,
) -> Strategy | None:
    """The mesh strategy when `config` asks for more than replicas (those are DDP's)."""
    config = config.resolved(info.num_processes)
    split = (config.dp_shard_enabled, config.tp_enabled, config.cp_enabled, config.pp_enabled)
    if not any(split):
        return None
    if name not in ("fsdp", "ddp"):
        raise ValueError(
            f"ParallelismConfig(dp_shard_size={config.dp_shard_size}, tp_size={config.tp_size}, "
            f"cp_size={config.cp_size}) runs on the FSDP2 mesh strategy, not on {name!r}; "
            f"drop the {name} plugin or the ParallelismConfig."
        )
    from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
    from accel_parallel._mesh import MeshStrategy

    if fsdp_plugin is None:
        fsdp_plugin = FullyShardedDataParallelPlugin.from_launch_config(
            launch.get("fsdp_config") or {}
        )
    if config.pp_enabled:
        from accel_parallel._pipeline import PipelineStrategy

        return PipelineStrategy(info, config, fsdp_plugin, mixed_precision=mixed_precision)
    return MeshStrategy(info, config, fsdp_plugin, mixed_precision=mixed_precision)
