"""Strategies: selection, single device, and DDP with its communication hooks on 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_parallel import (
    DDPCommunicationHookType,
    DDPStrategy,
    DistributedDataParallelKwargs,
    FSDP2Strategy,
    FullyShardedDataParallelPlugin,
    ProcessInfo,
    SingleDeviceStrategy,
    select_strategy,
)

CPU = torch.device("cpu")


def test_selection_follows_the_number_of_processes() -> None:
    assert isinstance(select_strategy(ProcessInfo(CPU)), SingleDeviceStrategy)
    assert isinstance(select_strategy(ProcessInfo(CPU, num_processes=2)), DDPStrategy)
    with pytest.raises(ValueError, match="cannot run 2 processes"):
        select_strategy(ProcessInfo(CPU, num_processes=2), name="single_device")
    with pytest.raises(TypeError, match="must be a DeepSpeedPlugin"):
        select_strategy(ProcessInfo(CPU), deepspeed_plugin=object())
    plugin = FullyShardedDataParallelPlugin()
    assert isinstance(select_strategy(ProcessInfo(CPU), fsdp_plugin=plugin), FSDP2Strategy)
    launched = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": False}}
    chosen = select_strategy(ProcessInfo(CPU, num_processes=2), launch_config=launched)
    assert isinstance(chosen, FSDP2Strategy) and chosen.plugin.reshard_after_forward is False
    with pytest.raises(ValueError, match="Unknown strategy 'zero'"):
        select_strategy(ProcessInfo(CPU), name="zero")


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


def _grads(hook: str, wrapper: str, option: dict) -> dict:
    import torch.distributed as dist

    from accel_state import PartialState

    state = PartialState(cpu=True)
    info = ProcessInfo(CPU, state.num_processes, state.process_index)
    kwargs = DistributedDataParallelKwargs(
        comm_hook=hook, comm_wrapper=wrapper, comm_state_option=option
    )
    torch.manual_seed(0)
    model = DDPStrategy(info, kwargs).wrap_model(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)))
    g = torch.Generator().manual_seed(10 + state.process_index)
    out = {"grads": []}
    for _ in range(3):
        model.zero_grad()
        model(torch.randn(6, 8, generator=g)).pow(2).mean().backward()
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
                torch.testing.assert_close(a, b)
        assert rank0["no_sync_differs"]
    exact = results[0]["none"]["grads"]
    for name, tol in (("fp16", 1e-3), ("bf16", 2e-2)):
        for got, want in zip(results[0][name]["grads"], exact):
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    # PowerSGD (plain and batched) reduces exactly until start_powerSGD_iter, then approximates
    for name in ("power_sgd", "batched"):
        for a, b in zip(results[0][name]["grads"][0], exact[0]):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
        assert any(
            not torch.allclose(a, b, atol=1e-6)
            for a, b in zip(results[0][name]["grads"][2], exact[2])
        )
        for got in results[0][name]["grads"][1:]:
            assert all(torch.isfinite(g).all() for g in got)
