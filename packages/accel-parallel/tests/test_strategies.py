"""Strategies: single device, and DDP with its communication hooks on 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_parallel import (
    DDPCommunicationHookType,
    DDPStrategy,
    DistributedDataParallelKwargs,
    ProcessInfo,
    SingleDeviceStrategy,
)

CPU = torch.device("cpu")


def test_single_device_moves_and_unwraps() -> None:
    strategy = SingleDeviceStrategy(ProcessInfo(torch.device("meta")))
    model = strategy.wrap_model(nn.Linear(2, 2))
    assert model.weight.device.type == "meta"
    with pytest.raises(ValueError, match="meta device"):
        SingleDeviceStrategy(ProcessInfo(CPU)).wrap_model(model)
    compiled_like = nn.Module()
    compiled_like._orig_mod = nn.Linear(2, 2)
    assert strategy.unwrap_model(compiled_like) is compiled_like._orig_mod


def test_ddp_kwargs_validate() -> None:
    kwargs = DistributedDataParallelKwargs(comm_hook="fp16", bucket_cap_mb=10, static_graph=True)
    assert kwargs.comm_hook is DDPCommunicationHookType.FP16
    args = kwargs.ddp_arguments()
    assert args["bucket_cap_mb"] == 10 and args["static_graph"] is True
    assert "broadcast_buffers" not in args  # default: left to DDP
    assert (
        DistributedDataParallelKwargs(broadcast_buffers=False).ddp_arguments()["broadcast_buffers"]
        is False
    )
    with pytest.raises(ValueError, match="comm_wrapper='power_sgd'"):
        DistributedDataParallelKwargs(comm_wrapper="power_sgd")
    with pytest.raises(ValueError, match="bucket_cap_mb=0"):
        DistributedDataParallelKwargs(bucket_cap_mb=0)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))


def _loss(model: nn.Module, g: torch.Generator) -> torch.Tensor:
    return model(torch.randn(6, 8, generator=g)).pow(2).mean()


def _local_grads(rank: int) -> list[list[torch.Tensor]]:
    """Rank `rank`'s gradients of _grads' 3 backwards before any reduction (nothing steps)."""
    model, g = _model(), torch.Generator().manual_seed(10 + rank)
    out = []
    for _ in range(3):
        model.zero_grad()
        _loss(model, g).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def _grads(hook: str, wrapper: str, option: dict) -> dict:
    import torch.distributed as dist

    from accel_state import PartialState

    state = PartialState(cpu=True)
    info = ProcessInfo(CPU, state.num_processes, state.process_index)
    kwargs = DistributedDataParallelKwargs(
        comm_hook=hook, comm_wrapper=wrapper, comm_state_option=option
    )
    model = DDPStrategy(info, kwargs).wrap_model(_model())
    g = torch.Generator().manual_seed(10 + state.process_index)
    out = {"grads": []}
    for _ in range(3):
        model.zero_grad()
        _loss(model, g).backward()
        out["grads"].append([p.grad.clone() for p in model.parameters()])
    # under no_sync the ranks keep their own gradients
    model.zero_grad()
    with DDPStrategy(info, kwargs).no_sync(model):
        model(torch.randn(6, 8, generator=g)).pow(2).mean().backward()
    mine = torch.cat([p.grad.flatten() for p in model.parameters()])
    other = [torch.zeros_like(mine) for _ in range(state.num_processes)]
    dist.all_gather(other, mine)
    out["no_sync_differs"] = not torch.equal(other[0], other[1])
    return out


def _all_hooks() -> dict:
    cases = {
        "none": ("no", "no", {}),
        "fp16": ("fp16", "no", {}),
        "bf16": ("bf16", "no", {}),
        "power_sgd": (
            "power_sgd",
            "fp16",
            {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
        ),
        # torch's batched hook hands a 2-D matrix to an orthogonalization that requires 3-D
        # once it starts compressing; accel-parallel makes it pass (steps 2 and 3 compress).
        "batched": (
            "batched_power_sgd",
            "no",
            {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
        ),
    }
    return {name: _grads(*case) for name, case in cases.items()}


def test_ddp_hooks_on_two_processes() -> None:
    from accel_state.testing import run_distributed

    results = run_distributed(_all_hooks, world_size=2, timeout=180)
    for name in ("none", "fp16", "bf16", "power_sgd", "batched"):
        rank0, rank1 = results[0][name], results[1][name]
        # every hook leaves both ranks with the same (averaged) gradients
        for g0, g1 in zip(rank0["grads"], rank1["grads"]):
            for a, b in zip(g0, g1):
                assert torch.equal(a, b)
        assert rank0["no_sync_differs"]
    exact = results[0]["none"]["grads"]
    local = list(zip(_local_grads(0), _local_grads(1)))

    def bound(step: int, unit: float) -> list[torch.Tensor]:
        """How far a reduction that rounds each rank's gradient to `unit` (a relative
        precision) and their sum once more may be from the exact mean: unit * (|g0| + |g1|),
        plus float32 rounding (4 * 2**-24 of the same) and fp16's subnormal spacing 2**-24."""
        return [(unit + 4 * 2.0**-24) * (g0.abs() + g1.abs()) + 2.0**-24
                for g0, g1 in zip(*local[step])]  # fmt: skip

    for step, want in enumerate(exact):  # the plain all-reduce: the mean of the two
        for a, g0, g1, tol in zip(want, *local[step], bound(step, 0.0)):
            assert ((a - (g0 + g1) / 2).abs() <= tol).all()
    for name, unit in (("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        for step, (got, want) in enumerate(zip(results[0][name]["grads"], exact)):
            for a, b, tol in zip(got, want, bound(step, unit)):
                assert ((a - b).abs() <= tol).all(), (name, step)
    # PowerSGD (plain, with the fp16 wrapper, and batched) reduces exactly until
    # start_powerSGD_iter, then approximates: further off than the wrapper's rounding
    for name, unit in (("power_sgd", 2.0**-11), ("batched", 0.0)):
        for a, b, tol in zip(results[0][name]["grads"][0], exact[0], bound(0, unit)):
            assert ((a - b).abs() <= tol).all(), name
        got = results[0][name]["grads"][2]
        assert any(((a - b).abs() > tol).any() for a, b, tol in zip(got, exact[2], bound(2, unit)))
        for got in results[0][name]["grads"][1:]:
            assert all(torch.isfinite(g).all() for g in got)


def _llama_with_and_without_recompute() -> dict:
    """Two AdamW steps of a transformers Llama (its config keeps use_cache on, the default;
    eager attention, whose explicit mask fails on keys appended twice) under FSDP2 with and
    without activation checkpointing; then its eval forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from accel_parallel import FSDP2Strategy, FullyShardedDataParallelPlugin

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         attn_implementation="eager")  # fmt: skip
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    out: dict = {}
    for ac in (False, True):
        torch.manual_seed(0)
        plugin = FullyShardedDataParallelPlugin(activation_checkpointing=ac)
        model = FSDP2Strategy(ProcessInfo(CPU), plugin).wrap_model(LlamaForCausalLM(config))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(2):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        model.eval()
        with torch.no_grad():
            cache = model(input_ids=ids).past_key_values
        out[ac] = (torch.stack(losses), cache is not None and cache.get_seq_length() == 16)
    return out


@pytest.mark.needs("transformers")
def test_activation_checkpointing_trains_a_transformers_model_with_its_cache_on() -> None:
    """Recomputing a decoder layer used to append its keys to the KV cache a second time
    (backward failed on mismatched shapes): in training the cache is off, and the losses
    equal those without recomputation; eval keeps the cache."""
    from accel_state.testing import run_distributed

    (out,) = run_distributed(_llama_with_and_without_recompute, world_size=1, timeout=180)
    (plain, plain_cache), (recomputed, cache) = out[False], out[True]
    torch.testing.assert_close(recomputed, plain, rtol=0, atol=0)  # the same kernels again
    assert plain_cache and cache
