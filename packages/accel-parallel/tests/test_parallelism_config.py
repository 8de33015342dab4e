"""ParallelismConfig, the tensor-parallel plan and the mesh strategy's refusals, in one process
(the multi-process training is in packages/accel/tests/test_mesh.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)


class Net(nn.Module):
    _tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.out = nn.Linear(4, 1)


class PlainNet(Net):
    _tp_plan = None


def test_sizes_must_multiply_to_world_size() -> None:
    from accel_parallel import ParallelismConfig

    with pytest.raises(ValueError, match=r"= 6, but the run has 4 processes"):
        ParallelismConfig(dp_shard_size=3, tp_size=2).resolved(4)
    assert ParallelismConfig().resolved(4).dp_replicate_size == 4  # nothing set: DDP
    with pytest.raises(ValueError, match="tp_size=0"):
        ParallelismConfig(tp_size=0)
    with pytest.raises(ValueError, match="dp_shard_size=2"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)


def test_options_that_would_do_nothing_are_refused() -> None:
    from accel_parallel import (
        DistributedDataParallelKwargs,
        ParallelismConfig,
        ProcessInfo,
        TorchTensorParallelPlugin,
        resolve_strategy,
    )

    with pytest.raises(ValueError, match="tp_plan=...\\) with tp_size=1"):
        ParallelismConfig(dp_shard_size=2, tp_plan={"fc": "colwise"})
    with pytest.raises(ValueError, match="torch_device_mesh"):
        TorchTensorParallelPlugin(tp_size=2, torch_device_mesh=object())
    assert TorchTensorParallelPlugin(tp_size=2).to_parallelism_config(4).dp_shard_size == 2
    info = ProcessInfo(device=torch.device("cpu"), num_processes=4)
    with pytest.raises(ValueError, match="DistributedDataParallelKwargs apply to DDP"):
        resolve_strategy(
            info,
            ddp_kwargs=DistributedDataParallelKwargs(),
            parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
        )
    ddp = resolve_strategy(info, parallelism_config=ParallelismConfig(dp_replicate_size=4))
    assert ddp.strategy.name == "ddp"  # replicas alone are DDP


def test_names_and_flattened_dims() -> None:
    from accel_parallel import ParallelismConfig

    c = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2, tp_size=2)
    assert c.active_mesh_dims == ["dp_replicate", "dp_shard", "cp", "tp"]
    assert c.dp_dim_names == ["dp_replicate", "dp_shard"]
    assert c.dp_shard_cp_dim_names == ["dp_shard", "cp"]
    assert c.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert c.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert (c.total_size, c.data_parallel_size, c.non_data_parallel_size) == (16, 4, 4)
    assert c.cp_handler.cp_comm_strategy == "allgather"
    assert c._get_mesh() == (("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2))
    assert ParallelismConfig(dp_shard_size=4, tp_size=2)._get_mesh() == (("dp_shard", "tp"), (4, 2))


def test_launch_section_and_environment() -> None:
    from accel_parallel import ParallelismConfig, resolve_parallelism_config

    section = {"parallelism_config_dp_shard_size": 2, "parallelism_config_tp_size": "2"}
    c = resolve_parallelism_config(None, world_size=4, launch_section=section)
    assert (c.dp_shard_size, c.tp_size) == (2, 2)
    env = {"PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}
    c = resolve_parallelism_config(None, world_size=4, environ=env)
    assert (c.dp_replicate_size, c.dp_shard_size) == (2, 2)
    with pytest.warns(UserWarning, match="using the code's"):
        c = resolve_parallelism_config(
            ParallelismConfig(tp_size=4), world_size=4, launch_section=section
        )
    assert c.tp_size == 4
    c = resolve_parallelism_config(
        None, world_size=4, environ={"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    )
    assert c.dp_replicate_size == 4  # asked for a mesh, no sizes: every process a replica
    assert resolve_parallelism_config(None, world_size=4, environ={}) is None
    sp = ParallelismConfig.from_launch_config(
        {"parallelism_config_sp_size": 2, "parallelism_config_sp_seq_length": "None",
         "parallelism_config_sp_attn_implementation": "sdpa"}
    )  # fmt: skip
    assert (sp.sp_size, sp.sp_handler.sp_attn_implementation) == (2, "sdpa")
    with pytest.raises(ValueError, match="sp_backend='megatron'"):
        ParallelismConfig.from_launch_config(
            {"parallelism_config_sp_size": 2, "parallelism_config_sp_backend": "megatron"}
        )
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        ParallelismConfig.from_environment(
            {"PARALLELISM_CONFIG_CP_SIZE": "2", "PARALLELISM_CONFIG_CP_COMM_STRATEGY": "ring"}
        )


def test_context_parallel_on_cpu_is_refused() -> None:
    from accel_parallel import MeshStrategy, ParallelismConfig, ProcessInfo

    info = ProcessInfo(device=torch.device("cpu"), num_processes=2)
    with pytest.raises(ValueError, match="context parallel .* needs the CUDA SDPA kernels"):
        MeshStrategy(info, ParallelismConfig(cp_size=2))


def test_bad_plans_are_named() -> None:
    from accel_parallel._tp import resolve_plan

    with pytest.raises(ValueError, match="declares none"):
        resolve_plan(PlainNet(), None)
    with pytest.raises(ValueError, match=r"'blocks\.\*\.gate' matches no module"):
        resolve_plan(PlainNet(), {"blocks.*.gate": "colwise"})
    with pytest.raises(ValueError, match="'diagonal' is not a style"):
        resolve_plan(PlainNet(), {"out": "diagonal"})
    assert sorted(resolve_plan(Net(), None)) == [
        "blocks.0.down", "blocks.0.up", "blocks.1.down", "blocks.1.up"
    ]  # fmt: skip


def test_a_plan_that_would_split_a_tied_weight_is_refused() -> None:
    from accel_parallel._tp import apply_tensor_parallel

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.body = nn.Linear(8, 8)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.embed.weight

    for plan in ({"head": "colwise"}, {"embed": "embedding_rowwise", "body": "colwise"}):
        with pytest.raises(ValueError, match=r"\['embed.weight', 'head.weight'\] are one tied"):
            apply_tensor_parallel(Tied(), None, plan)  # refused before any mesh is touched


def test_accelerate_spelling_fills_unset_fields_from_the_environment(monkeypatch) -> None:
    from accel_parallel import ParallelismConfig, resolve_parallelism_config
    from accel_parallel._env_filled import ParallelismConfig as EnvParallelismConfig

    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    c = EnvParallelismConfig()
    assert (c.dp_replicate_size, c.dp_shard_size, c.tp_size, c.cp_size) == (1, 2, 2, 1)
    assert EnvParallelismConfig(tp_size=4).tp_size == 4  # the code's value wins
    assert ParallelismConfig().tp_size == 1  # accel_parallel's own class reads nothing
    assert isinstance(c, ParallelismConfig) and repr(c).startswith("ParallelismConfig(")
    resolved = resolve_parallelism_config(c, world_size=4)
    assert type(resolved) is EnvParallelismConfig and resolved.total_size == 4
    cp = EnvParallelismConfig(dp_shard_size=1, tp_size=1, cp_size=2)
    assert cp.cp_handler.cp_comm_strategy == "alltoall"
    assert ParallelismConfig(cp_size=2).cp_handler.cp_comm_strategy == "allgather"
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring")
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        EnvParallelismConfig(dp_shard_size=1, tp_size=1, cp_size=2)
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(ValueError, match="PARALLELISM_CONFIG_TP_SIZE='two'"):
        EnvParallelismConfig()


def test_fields_take_accelerates_positions_and_backends() -> None:
    from accel_parallel import ParallelismConfig

    c = ParallelismConfig(2, 4)
    assert (c.dp_replicate_size, c.dp_shard_size, c.cp_backend, c.sp_backend) == (
        2, 4, "torch", "deepspeed"
    )  # fmt: skip
    with pytest.raises(ValueError, match="cp_backend='ring'"):
        ParallelismConfig(cp_backend="ring")
    with pytest.raises(ValueError, match="takes a TorchContextParallelConfig"):
        ParallelismConfig(cp_size=2, cp_handler=object())


def test_sequence_parallel_takes_the_processes_it_does_not_share_as_data_parallel(
    monkeypatch,
) -> None:
    from accel_parallel import ParallelismConfig
    from accel_parallel._env_filled import DeepSpeedSequenceParallelConfig as EnvSP
    from accel_parallel._sequence_parallel import DeepSpeedSequenceParallelConfig

    c = ParallelismConfig(sp_size=2)
    assert c.sp_handler.sp_seq_length_is_variable is True
    assert (c.non_dp_dim_names, c.total_size) == (["sp"], 2)
    assert c.build_device_mesh("cpu") is None  # DeepSpeed makes its own groups
    assert c.resolved(2) is c
    assert (c.resolved(4).dp_shard_size, c.resolved(4).total_size) == (2, 4)
    with pytest.raises(ValueError, match="sp_size=2.*does not divide the 3 processes"):
        c.resolved(3)
    with pytest.raises(ValueError, match="= 4, but the run has 2 processes"):
        ParallelismConfig(sp_size=2, dp_shard_size=2).resolved(2)
    with pytest.raises(ValueError, match="composes with data parallel only"):
        ParallelismConfig(sp_size=2, tp_size=2).resolved(4)
    with pytest.raises(ValueError, match="set one of them to 1"):
        ParallelismConfig(cp_size=2, sp_size=2)
    with pytest.raises(ValueError, match="Invalid sp_attn_implementation: foobar"):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation="foobar")
    assert DeepSpeedSequenceParallelConfig(sp_attn_implementation="org/flash-attn3")
    with pytest.raises(ValueError, match="needs sp_seq_length"):
        DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "128")
    assert (EnvSP().sp_seq_length_is_variable, EnvSP().sp_seq_length) == (False, 128)


def test_build_device_mesh_slices_by_name_lists_and_checks_a_real_group(monkeypatch) -> None:
    from unittest.mock import MagicMock

    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh

    from accel_parallel import ParallelismConfig

    sliced = []
    mesh = MagicMock()
    mesh.__getitem__.side_effect = lambda key: sliced.append(key) or MagicMock()
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **k: mesh)
    c = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    assert c.build_device_mesh("cpu") is mesh  # no process group: nothing to check against
    assert sliced == [["dp_replicate", "dp_shard"], ["dp_shard", "cp"],
                      ["dp_replicate", "dp_shard", "cp"]]  # fmt: skip
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    with pytest.raises(ValueError, match="= 8, but the run has 4 processes"):
        ParallelismConfig(dp_shard_size=8).build_device_mesh("cpu")


def test_a_mesh_built_again_in_a_new_process_group_flattens_over_its_groups() -> None:
    """The same degrees built into a mesh in a second process group (the first destroyed, as
    the memory estimate's traces do) get flattened meshes whose groups exist: torch 2.9 handed
    back the first mesh's, from a process-wide table keyed by equal meshes."""
    from accel_parallel import ParallelismConfig
    from accel_parallel._memory_trace import fake_process_group

    for _ in range(2):
        with fake_process_group(4):
            config = ParallelismConfig(tp_size=2, dp_shard_size=2)
            config.build_device_mesh("cpu")
            assert config.fsdp_mesh().get_group(0) is not None  # resolves its process group
