"""Pipeline plans, the pp fields of ParallelismConfig and MegatronLMPlugin's mapping: one
process, nothing launched (the multi-process training is in accel's tests/test_pipeline.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_parallel import MegatronLMPlugin, ParallelismConfig, megatron_settings
from accel_parallel._pipeline_plan import build_stages, stage_to_rank


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.out = nn.Linear(8, 1)


def _run(stages: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for stage in stages:
        x = stage(x)
    return x


def test_module_plan_splits_evenly_in_order_and_runs_as_the_chain() -> None:
    model = Net()
    stages = build_stages(model, ["inp", "blocks", "out"], 2)
    assert [list(s.unit_names.values()) for s in stages] == [
        ["inp", "blocks.0", "blocks.1"],
        ["blocks.2", "out"],
    ]
    x = torch.randn(2, 4)
    expected = model.out(model.blocks[2](model.blocks[1](model.blocks[0](model.inp(x)))))
    torch.testing.assert_close(_run(stages, x), expected)
    explicit = build_stages(model, [["inp"], ["blocks.*", "out"]], 2)
    assert list(explicit[1].unit_names.values()) == ["blocks.0", "blocks.1", "blocks.2", "out"]


def test_bad_plans_are_refused_with_the_fix() -> None:
    model = Net()
    with pytest.raises(ValueError, match="stage 1 is empty.*fewer stages"):
        build_stages(model, [["inp", "blocks", "out"], []], 2)
    with pytest.raises(ValueError, match="leaves a stage empty.*fewer stages"):
        build_stages(model, ["inp", "out"], 3)
    with pytest.raises(ValueError, match=r"does not cover the model: \['out.bias'"):
        build_stages(model, ["inp", "blocks"], 2)
    with pytest.raises(ValueError, match="'head' matches no module"):
        build_stages(model, ["inp", "blocks", "head"], 2)
    with pytest.raises(ValueError, match="lists 2 stages, the run has 4"):
        build_stages(model, [["inp", "blocks"], ["out"]], 4)
    with pytest.raises(ValueError, match="needs a plan"):
        build_stages(model, None, 2)


def test_transformers_decoder_plan_puts_embedding_first_and_head_last() -> None:
    transformers = pytest.importorskip("transformers")

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    stages = build_stages(model, None, 2)
    assert list(stages[0].unit_names.values()) == [
        "model.embed_tokens", "model.layers.0", "model.layers.1",
    ]  # fmt: skip
    assert list(stages[1].unit_names.values()) == ["model.layers.2", "model.norm", "lm_head"]
    ids = torch.randint(0, 32, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(_run(stages, ids), model(input_ids=ids).logits)
    with pytest.raises(ValueError, match="3 decoder layers for 4 stages"):
        build_stages(model, None, 4)


def test_pipeline_fields_are_validated_and_filled() -> None:
    config = ParallelismConfig(pp_size=2, dp_shard_size=2, tp_size=2)
    assert (config.pp_schedule, config.pp_microbatches, config.pp_virtual_stages) == ("1F1B", 2, 1)
    assert config.active_mesh_dims == ["pp", "dp_shard", "tp"] and config.total_size == 8
    interleaved = ParallelismConfig(pp_size=2, pp_schedule="interleaved1f1b")
    assert (interleaved.pp_schedule, interleaved.pp_virtual_stages) == ("Interleaved1F1B", 2)
    assert stage_to_rank("ZBVZeroBubble", 2, 4) == {0: 0, 1: 1, 2: 1, 3: 0}
    with pytest.raises(ValueError, match="pp_schedule='Nope'.*accepted"):
        ParallelismConfig(pp_size=2, pp_schedule="Nope")
    with pytest.raises(ValueError, match="1F1B runs one stage per rank"):
        ParallelismConfig(pp_size=2, pp_virtual_stages=2)
    with pytest.raises(ValueError, match="pp_plan=...\\) with pp_size=1"):
        ParallelismConfig(pp_plan=["a"])
    with pytest.raises(ValueError, match="pp_size=2.*composes with FSDP2"):
        ParallelismConfig(pp_size=2, dp_replicate_size=2)
    with pytest.raises(ValueError, match="pp_size x dp_replicate_size.*launch 4 processes"):
        ParallelismConfig(pp_size=2, tp_size=2).resolved(2)


def test_megatron_plugin_maps_onto_the_mesh() -> None:
    plugin = MegatronLMPlugin(
        tp_degree=2, pp_degree=2, num_micro_batches=4, use_distributed_optimizer=True,
        gradient_clipping=1.0, recompute_activations=True,
    )  # fmt: skip
    config, fsdp, clip = megatron_settings(
        plugin, {}, world_size=8, parallelism_config=None, fsdp_plugin=None
    )
    assert (config.tp_size, config.pp_size, config.dp_shard_size) == (2, 2, 2)
    assert config.pp_microbatches == 4 and clip == 1.0 and fsdp.activation_checkpointing
    assert MegatronLMPlugin().to_parallelism_config(2).dp_replicate_size == 2  # plain DDP
    sequence = MegatronLMPlugin(tp_degree=2, sequence_parallelism=True).to_parallelism_config(2)
    assert sequence.tp_size == 2 and sequence.tp_handler.sequence_parallel
    with pytest.raises(
        ValueError, match=r"sequence_parallelism=True, tp_degree=None.*tp_degree > 1"
    ):
        MegatronLMPlugin(sequence_parallelism=True)
    with pytest.raises(ValueError, match="pp_size=2, cp_size=2.*Set cp_size=1"):
        MegatronLMPlugin(pp_degree=2, context_parallel_size=2).to_parallelism_config(4)
    with pytest.raises(ValueError, match="train_iters=10.*leave it at its default"):
        MegatronLMPlugin(train_iters=10)
    with pytest.raises(ValueError, match="set use_distributed_optimizer=True"):
        MegatronLMPlugin(pp_degree=2).to_parallelism_config(4)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4"):
        MegatronLMPlugin(num_micro_batches=4).to_parallelism_config(1)
    with pytest.raises(ValueError, match="not both"):
        megatron_settings(plugin, {}, world_size=8, parallelism_config=config, fsdp_plugin=None)
    section = {"megatron_lm_pp_degree": 2, "megatron_lm_use_custom_fsdp": "false"}
    launched = {"distributed_type": "MEGATRON_LM", "megatron_lm_config": section}
    config, _, clip = megatron_settings(
        None, launched, world_size=2, parallelism_config=None, fsdp_plugin=None
    )
    assert config.pp_size == 2 and clip is None


def test_sequence_parallel_plan_for_a_decoder_and_refusals() -> None:
    """The regions laid out on a transformers decoder's plan (the numbers are checked against
    one process in accel's tests/test_pipeline.py); other models need a plan that has them."""
    transformers = pytest.importorskip("transformers")
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    from accel_parallel._tp import resolve_plan

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    plan = resolve_plan(model, None, sequence_parallel=True)
    for name in ("model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
                 "model.norm"):  # fmt: skip
        assert isinstance(plan[name], SequenceParallel)
    for name in ("model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj"):
        assert isinstance(plan[name], RowwiseParallel) and plan[name].output_layouts == (Shard(1),)
    head = plan["lm_head"]
    assert isinstance(head, ColwiseParallel) and head.input_layouts == (Shard(1),)
    assert "model.layers.0" in plan and "model.layers.1" not in plan  # the stream splits once
    unsplit = {k: v for k, v in model._tp_plan.items() if "o_proj" not in k}
    with pytest.raises(ValueError, match="no row-split output layer.*'self_attn'"):
        resolve_plan(model, unsplit, sequence_parallel=True)
    with pytest.raises(ValueError, match="Net is not a transformers decoder.*sequence_parallel"):
        resolve_plan(Net(), {"blocks.*": "colwise"}, sequence_parallel=True)
    given = resolve_plan(Net(), {"inp": "sequence_parallel"}, sequence_parallel=True)
    assert list(given) == ["inp"]  # a plan with its own regions is used as it is
