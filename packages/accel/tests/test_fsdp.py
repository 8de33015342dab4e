"""FSDP2 through the Accelerator, for real: gloo workers on CPU, compared with one process.

Few launches (each costs seconds): one 2-process launch trains every variant in turn and
saves a checkpoint; one 2-process launch resumes it; one 1-process launch resumes the
2-process checkpoint on a different number of processes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from accel_state.testing import run_distributed
from accel_testkit.models import Stack
from accel_testkit.tolerance import assert_same_training, float32_error, norm_terms

GLOBAL_BATCH, STEPS = 16, 4
# Net: 5 linear layers, reductions of at most 32 terms (the width, 16 rows). SGD (linear in
# the gradient) rather than Adam: see accel_testkit.tolerance. Momentum gives the optimizer a
# state for FSDP2 to shard and the checkpoints to save and reshard.
NET_ERROR = float32_error(layers=5, terms=32)


class Net(Stack):
    """inp: 8 -> 32, 3 blocks x + tanh(fc(x)) of 32, out: 32 -> 1. From Stack it declares
    `_no_split_modules = ["Block"]`, as transformers models do: the default wrap policy."""

    def __init__(self, width: int = 32) -> None:
        super().__init__(width=width, depth=3)


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def reference(steps: int = STEPS) -> tuple[dict[str, torch.Tensor], float]:
    """One process, plain PyTorch, the whole global batch each step."""
    model = make_net()
    opt = make_optimizer(model.parameters())
    norm = 0.0
    for step in range(steps):
        x, y = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norm


def _local_numel(t: torch.Tensor) -> int:
    return (t.to_local() if hasattr(t, "to_local") else t).numel()


def _train(acc: Any, model: Any, opt: Any, steps: range, accum: int = 1) -> float:
    rank, world = acc.process_index, acc.num_processes
    per = GLOBAL_BATCH // world
    norm = torch.tensor(0.0)
    for step in steps:
        x, y = batch(step)
        x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        for part in range(accum):
            size = per // accum
            xs, ys = x[part * size : (part + 1) * size], y[part * size : (part + 1) * size]
            with acc.accumulate(model):
                acc.backward(nn.functional.mse_loss(model(xs), ys))
                clipped = acc.clip_grad_norm_(model.parameters(), 1e9)
                norm = clipped if clipped is not None else norm
                opt.step()
                opt.zero_grad()
    return float(norm)


def _variant(plugin_kwargs: dict, mixed: str = "no", accum: int = 1) -> dict:
    from accel import (
        Accelerator,
        AcceleratorState,
        FullyShardedDataParallelPlugin,
        init_empty_weights,
    )

    AcceleratorState._reset_state()  # the process group stays; the next Accelerator adopts it
    acc = Accelerator(
        cpu=True,
        mixed_precision=mixed,
        gradient_accumulation_steps=accum,
        fsdp_plugin=FullyShardedDataParallelPlugin(**plugin_kwargs),
    )
    if plugin_kwargs.get("cpu_ram_efficient_loading") and acc.process_index != 0:
        with init_empty_weights():  # only rank 0 holds the weights; the others get theirs
            model = Net()
    else:
        model = make_net()
    opt = make_optimizer(model.parameters())  # made before prepare, on the full model
    model, opt = acc.prepare(model, opt)
    norm = _train(acc, model, opt, range(STEPS), accum)
    opt_local = sum(_local_numel(v) for s in opt.state.values() for v in s.values() if v.ndim > 0)
    return {
        "state": acc.get_state_dict(model),
        "norm": norm,
        "param_local": sum(_local_numel(p) for p in model.parameters()),
        "param_total": sum(p.numel() for p in model.parameters()),
        "opt_local": opt_local,
        "is_fsdp2": acc.is_fsdp2,
        "wrapped": sorted(type(m).__name__ for m in model.modules() if hasattr(m, "reshard")),
    }


def _variants_and_save(folder: str) -> dict:
    out = {
        "fp32": _variant({}),
        "accumulate": _variant({}, accum=2),
        "checkpointing": _variant({"activation_checkpointing": True}),
        "offload": _variant({"cpu_offload": True}),
        "bf16": _variant({}, mixed="bf16"),
        "no_reshard": _variant({"reshard_after_forward": False, "auto_wrap_policy": "no_wrap"}),
        "efficient": _variant({"cpu_ram_efficient_loading": True}),
    }
    out["resume"] = _resume(folder, "first")
    out["llama"] = _llama(folder + "_llama")
    out["full"] = _full_round_trip(folder + "_full")
    return out


def _full_round_trip(folder: str) -> dict:
    """state_dict_type FULL_STATE_DICT: gathered, written once, read on rank 0 and sent."""
    import os

    from accel import Accelerator, AcceleratorState, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state()
    plugin = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    _train(acc, model, opt, range(2))
    acc.save_state(folder)
    saved = acc.get_state_dict(model)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    acc.load_state(folder)
    restored = acc.get_state_dict(model)
    same = all(torch.equal(restored[k], v) for k, v in saved.items())
    return {"files": sorted(os.listdir(folder)), "same": same, "n": len(saved)}


def _tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _llama(export: str) -> dict:
    """A transformers model built from a config (no download) under FSDP2: its decoder layers
    are wrapped from `_no_split_modules`, the tied embedding stays tied, save_model reloads."""
    from accel import Accelerator, AcceleratorState, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    model = _tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    g = torch.Generator().manual_seed(acc.process_index)
    ids = torch.randint(0, 64, (4, 16), generator=g)
    losses = []
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    acc.save_model(model, export)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    wrapped = sorted(type(m).__name__ for m in model.modules() if hasattr(m, "reshard"))
    return {"losses": losses, "tied": tied, "wrapped": wrapped, "state": acc.get_state_dict(model)}


def _resume(folder: str, phase: str) -> dict:
    """first: train 2 steps, save (sharded), train 2 more. again: load, train the last 2."""
    from accel import Accelerator, AcceleratorState, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state()
    # The scheduler steps once per call (by default it steps once per process and optimizer
    # step, which differs between 2 processes and 1).
    acc = Accelerator(
        cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(), step_scheduler_with_optimizer=False
    )
    model = make_net()
    opt = make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    model, opt, sched = acc.prepare(model, opt, sched)
    result: dict = {}
    if phase == "first":
        for step in range(STEPS // 2):
            _train(acc, model, opt, range(step, step + 1))
            sched.step()
        # a copy: on one process the state dict holds the parameters themselves
        result["saved_state"] = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
        acc.save_state(folder)
        acc.save_model(model, folder + "_export")  # full weights, written by the main process
        # the same state saved asynchronously: staged now, written while training goes on
        acc.save_state(folder + "_async", async_save=True)
        import os

        result["files"] = sorted(os.listdir(folder))
        start = STEPS // 2
    else:
        acc.load_state(folder)
        start = STEPS // 2
    for step in range(start, STEPS):
        _train(acc, model, opt, range(step, step + 1))
        sched.step()
    acc.wait_for_checkpoint()
    result["state"] = acc.get_state_dict(model)
    result["lr"] = sched.get_last_lr()
    return result


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    folder = str(tmp_path_factory.mktemp("fsdp") / "ckpt")
    results = run_distributed(_variants_and_save, folder, world_size=2, timeout=300)
    again = run_distributed(_resume, folder, "again", world_size=2, timeout=300)
    resharded = run_distributed(_resume, folder, "again", world_size=1, timeout=300)
    # and the other way: saved by 1 process, resumed by 2
    single = str(tmp_path_factory.mktemp("fsdp1") / "ckpt")
    (one,) = run_distributed(_resume, single, "first", world_size=1, timeout=300)
    widened = run_distributed(_resume, single, "again", world_size=2, timeout=300)[0]
    return {"ranks": results, "again": again, "resharded": resharded[0], "folder": folder,
            "one": one, "widened": widened}  # fmt: skip


def _assert_state_close(state: dict, expected: dict, **tol: float) -> None:
    assert sorted(state) == sorted(expected)
    for k, v in expected.items():
        torch.testing.assert_close(state[k], v, **tol, msg=lambda m, k=k: f"{k}: {m}")


def test_two_process_fsdp2_equals_one_process(two_ranks):
    expected, norm = reference()
    start = make_net().state_dict()
    rank0, rank1 = two_ranks["ranks"]
    for name in ("fp32", "accumulate", "checkpointing", "offload", "no_reshard", "efficient"):
        assert_same_training(rank0[name]["state"], expected, start, bound=STEPS * NET_ERROR)
        assert rank1[name]["state"] == {}  # the full state dict is on the main process
    # the global norm of the last step's gradients (from weights STEPS - 1 steps apart, within
    # a step's rounding themselves), and its own sums
    rel = STEPS * float32_error(layers=5, terms=32, norm_terms=norm_terms(make_net().parameters()))
    assert rank0["fp32"]["norm"] == pytest.approx(norm, rel=rel)
    # bf16 parameters in forward/backward, float32 reduction and master weights: each of the
    # 2 * 5 + 1 chained results of a step is rounded to bf16's 8 bits (2**-8), so the steps'
    # gradients are within 11 * 2**-8 of float32's and the weights' drift within 4 times that.
    bf16_error = (2 * 5 + 1) * 2.0**-8
    assert_same_training(rank0["bf16"]["state"], expected, start, bound=STEPS * bf16_error)


def test_each_rank_holds_half_of_parameters_and_optimizer_state(two_ranks):
    for r in two_ranks["ranks"]:
        v = r["fp32"]
        assert v["is_fsdp2"] and v["wrapped"] == ["FSDPBlock"] * 3 + ["FSDPNet"]
        assert 0.45 <= v["param_local"] / v["param_total"] <= 0.55
        assert 0.45 <= v["opt_local"] / v["param_total"] <= 0.55  # the momentum buffers
    assert two_ranks["ranks"][0]["no_reshard"]["wrapped"] == ["FSDPNet"]  # no_wrap: the root only


def test_sharded_checkpoint_resumes_exactly_and_on_another_world_size(two_ranks):
    first = two_ranks["ranks"][0]["resume"]
    assert "pytorch_model_fsdp_0" in first["files"] and "optimizer_0" in first["files"]
    again = two_ranks["again"][0]
    # the same 2 processes and shards: the same sums in the same order, bit for bit
    _assert_state_close(again["state"], first["state"], rtol=0.0, atol=0.0)
    assert again["lr"] == first["lr"]
    # 2 -> 1 process: the sharded state (weights and momentum) loads and training continues
    # the same, within the rounding of the last STEPS // 2 steps' sums over 1 process, not 2
    after_load = (STEPS - STEPS // 2) * NET_ERROR
    resharded = two_ranks["resharded"]
    assert_same_training(resharded["state"], first["state"], first["saved_state"], after_load)
    assert resharded["lr"] == first["lr"]
    # 1 -> 2 processes
    one, widened = two_ranks["one"], two_ranks["widened"]
    assert_same_training(widened["state"], one["state"], one["saved_state"], after_load)
    assert_same_training(one["state"], first["state"], make_net().state_dict(), STEPS * NET_ERROR)
    assert widened["lr"] == one["lr"]


def test_plugin_translates_fsdp1_settings_and_refuses_what_it_cannot():
    from accel import FullyShardedDataParallelPlugin

    p = FullyShardedDataParallelPlugin(
        fsdp_version=1, sharding_strategy="SHARD_GRAD_OP", backward_prefetch="BACKWARD_PRE",
        use_orig_params=True, state_dict_type="FULL_STATE_DICT",
    )  # fmt: skip
    assert p.fsdp_version == 2 and p.reshard_after_forward is False
    assert any("SHARD_GRAD_OP -> reshard_after_forward=False" in n for n in p.notices)
    assert any("backward_prefetch" in n for n in p.notices)
    assert p.state_dict_type == "FULL_STATE_DICT"
    with pytest.raises(ValueError, match="NO_SHARD keeps full replicas"):
        FullyShardedDataParallelPlugin(sharding_strategy="NO_SHARD")
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT is FSDP1-only"):
        FullyShardedDataParallelPlugin(state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match="needs min_num_params"):
        FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap")
    with pytest.raises(ValueError, match="fsdp_config key 'fsdp_typo'"):
        FullyShardedDataParallelPlugin.from_launch_config({"fsdp_typo": 1})
    launched = FullyShardedDataParallelPlugin.from_launch_config(
        {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": "100",
         "fsdp_offload_params": "true", "fsdp_sharding_strategy": 1}
    )  # fmt: skip
    assert launched.auto_wrap_policy == "size_based_wrap" and launched.min_num_params == 100
    assert launched.cpu_offload is True and launched.reshard_after_forward is True


def test_full_state_dict_type_writes_one_file_and_loads_back(two_ranks):
    full = two_ranks["ranks"][0]["full"]
    assert "pytorch_model_fsdp.bin" in full["files"] and "optimizer.bin" in full["files"]
    assert not any(f.startswith("pytorch_model_fsdp_") for f in full["files"])
    assert full["same"] and full["n"] > 0


def test_save_model_and_merge_weights_give_plain_safetensors(two_ranks, tmp_path):
    from safetensors.torch import load_file

    from accel.utils import merge_fsdp_weights
    from accel_cli.main import main

    saved = two_ranks["ranks"][0]["resume"]["saved_state"]
    exported = load_file(two_ranks["folder"] + "_export/model.safetensors")
    _assert_state_close(exported, saved, rtol=0.0, atol=0.0)
    out = merge_fsdp_weights(two_ranks["folder"], tmp_path / "merged")
    _assert_state_close(load_file(out / "model.safetensors"), saved, rtol=0.0, atol=0.0)
    cli = ["merge-weights", two_ranks["folder"] + "/pytorch_model_fsdp_0", str(tmp_path / "cli")]
    assert main(cli) == 0
    _assert_state_close(load_file(tmp_path / "cli/model.safetensors"), saved, rtol=0.0, atol=0.0)
    # the asynchronous save of the same moment holds the same weights
    out = merge_fsdp_weights(two_ranks["folder"] + "_async", tmp_path / "async")
    _assert_state_close(load_file(out / "model.safetensors"), saved, rtol=0.0, atol=0.0)
    with pytest.raises(FileNotFoundError, match="not a sharded model folder"):
        merge_fsdp_weights(tmp_path, tmp_path / "nothing")


def test_transformers_llama_trains_under_fsdp2_and_its_export_reloads(two_ranks):
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from accel_bigmodel import load_checkpoint_in_model

    rank0 = two_ranks["ranks"][0]["llama"]
    assert rank0["wrapped"] == ["FSDPLlamaDecoderLayer"] * 2 + ["FSDPLlamaForCausalLM"]
    assert rank0["tied"] and rank0["losses"][-1] < rank0["losses"][0]
    export = two_ranks["folder"] + "_llama"
    exported = load_file(export + "/model.safetensors")
    tied_pair = {"lm_head.weight", "model.embed_tokens.weight"}
    assert len(set(rank0["state"]) - set(exported)) == 1  # the tied weight is written once
    assert set(rank0["state"]) - set(exported) < tied_pair
    for k, v in exported.items():
        assert torch.equal(v, rank0["state"][k]), k
    fresh = _tiny_llama()
    load_checkpoint_in_model(fresh, export)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    _assert_state_close(fresh.state_dict(), rank0["state"], rtol=0.0, atol=0.0)
