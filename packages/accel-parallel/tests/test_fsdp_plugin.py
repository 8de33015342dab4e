"""FullyShardedDataParallelPlugin's familiar methods (accelerate's set_* / validate_*)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from accel_parallel import FullyShardedDataParallelPlugin


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)


class Model(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 1)


def test_set_auto_wrap_policy_takes_the_models_no_split_modules() -> None:
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(Model())
    assert plugin.auto_wrap_policy == "transformer_based_wrap"
    assert plugin.transformer_cls_names_to_wrap == ["Block"]


def test_set_auto_wrap_policy_refuses_a_class_the_model_lacks() -> None:
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Decoder"])
    with pytest.raises(ValueError, match="Could not find the transformer layer class Decoder"):
        plugin.set_auto_wrap_policy(Model())


def test_set_auto_wrap_policy_keeps_size_and_callable_policies() -> None:
    sized = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=10)
    sized.set_auto_wrap_policy(Model())
    assert sized.auto_wrap_policy == "size_based_wrap"

    def policy(module: nn.Module) -> bool:
        return isinstance(module, Block)

    custom = FullyShardedDataParallelPlugin(auto_wrap_policy=policy)
    custom.set_auto_wrap_policy(Model())
    assert custom.auto_wrap_policy is policy
    plain = FullyShardedDataParallelPlugin()  # the default: by _no_split_modules
    plain.set_auto_wrap_policy(nn.Linear(2, 2))
    assert plain.transformer_cls_names_to_wrap == []


def test_set_state_dict_type_switches_the_format() -> None:
    from torch.distributed.fsdp import StateDictType

    plugin = FullyShardedDataParallelPlugin()
    assert plugin.state_dict_type == "SHARDED_STATE_DICT"
    plugin.set_state_dict_type("full_state_dict")
    assert plugin.state_dict_type == "FULL_STATE_DICT"
    plugin.set_state_dict_type(StateDictType.SHARDED_STATE_DICT)
    assert plugin.state_dict_type == "SHARDED_STATE_DICT"
    plugin.set_state_dict_type()  # None keeps it
    assert plugin.state_dict_type == "SHARDED_STATE_DICT"
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT is FSDP1-only"):
        plugin.set_state_dict_type("LOCAL_STATE_DICT")


def test_set_mixed_precision() -> None:
    plugin = FullyShardedDataParallelPlugin()
    plugin.set_mixed_precision("bf16")
    policy = plugin.mixed_precision_policy
    assert isinstance(policy, MixedPrecisionPolicy)
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16,) * 3
    plugin.set_mixed_precision("fp16")  # a policy is set: kept unless override
    assert plugin.mixed_precision_policy is policy
    plugin.set_mixed_precision(torch.float16, override=True)
    assert plugin.mixed_precision_policy.param_dtype == torch.float16
    with pytest.raises(ValueError, match="Invalid mixed precision: 'int8'"):
        plugin.set_mixed_precision("int8")


def test_mixed_precision_policy_by_name_and_dict() -> None:
    named = FullyShardedDataParallelPlugin(mixed_precision_policy="fp16")
    assert named.mixed_precision_policy.reduce_dtype == torch.float16
    as_dict = FullyShardedDataParallelPlugin(
        mixed_precision_policy={"param_dtype": "bfloat16", "reduce_dtype": torch.float32}
    )
    as_dict.validate_mixed_precision_policy()
    as_dict.set_mixed_precision("bf16")  # a dict is converted, not replaced
    assert as_dict.mixed_precision_policy.param_dtype == torch.bfloat16
    assert as_dict.mixed_precision_policy.reduce_dtype == torch.float32
    bad = FullyShardedDataParallelPlugin(mixed_precision_policy={"buffer_dtype": torch.float16})
    with pytest.raises(ValueError, match="must be an instance of"):
        bad.validate_mixed_precision_policy()


def test_cpu_offload_reads_torchs_policy_objects() -> None:
    # OffloadPolicy() is truthy but means "no offload"
    assert FullyShardedDataParallelPlugin(cpu_offload=OffloadPolicy()).cpu_offload is False
    assert FullyShardedDataParallelPlugin(cpu_offload=CPUOffloadPolicy()).cpu_offload is True
    plugin = FullyShardedDataParallelPlugin()
    plugin.cpu_offload = CPUOffloadPolicy()
    plugin.validate_cpu_offload()
    plugin.set_cpu_offload()
    assert plugin.cpu_offload is True
    plugin.cpu_offload = object()
    with pytest.raises(ValueError, match="cpu_offload="):
        plugin.validate_cpu_offload()


def test_activation_checkpointing_offload_is_a_field() -> None:
    assert FullyShardedDataParallelPlugin(activation_checkpointing_offload=False)
    with pytest.raises(ValueError, match="activation_checkpointing_offload=True"):
        FullyShardedDataParallelPlugin(activation_checkpointing_offload=True)
