"""Familiar behaviours that need several processes: one 2-process gloo launch checks them all."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_state.testing import run_distributed


def _uneven_inputs() -> dict:
    from torch.utils.data import DataLoader

    from accel import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.arange(20, dtype=torch.float32).reshape(5, 4) / 20
    loader = DataLoader(data, batch_size=1)
    model, opt, loader = acc.prepare(model, opt, loader)
    batches = 0
    with acc.join_uneven_inputs([model], even_batches=False):
        inside = loader.batch_sampler.even_batches
        for x in loader:  # 5 samples: rank 0 gets 3 batches, rank 1 gets 2
            acc.backward(model(x).pow(2).mean())
            opt.step()
            opt.zero_grad()
            batches += 1
    return {
        "batches": batches,
        "inside": inside,
        "after": loader.batch_sampler.even_batches,
        "weight": acc.unwrap_model(model).weight.detach().clone(),
    }


def _placement_and_dispatch(offload_dir: str) -> dict:
    from accel import Accelerator
    from accel.big_modeling import dispatch_model
    from accel_parallel import DDPStrategy, ProcessInfo

    acc = Accelerator(cpu=True)
    # device_placement=False: the wrapper takes the model where it is (here a device that
    # no parameter could be moved to, so any move would fail)
    elsewhere = DDPStrategy(ProcessInfo(torch.device("meta"), acc.num_processes, acc.process_index))
    with elsewhere.keeping_placement():
        kept = elsewhere.wrap_model(nn.Linear(2, 2))
    out = {"kept_device": str(next(kept.parameters()).device)}
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model = dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir=offload_dir)
    try:
        acc.prepare(model)
    except ValueError as err:
        out["dispatched_error"] = str(err)
    return out


def _compiled_unwrap() -> dict:
    from torch._dynamo.eval_frame import OptimizedModule

    from accel import Accelerator

    acc = Accelerator(cpu=True, dynamo_backend="eager")
    model = nn.Linear(3, 3)
    prepared = acc.prepare(model)
    kept = acc.unwrap_model(prepared)  # keep_torch_compile=True
    plain = acc.unwrap_model(prepared, keep_torch_compile=False)
    x = torch.randn(2, 3)
    return {
        "kept": isinstance(kept, OptimizedModule) and kept._orig_mod is model,
        "same_output": torch.equal(kept(x), model(x)),
        "plain": plain is model,
        "training_model_keeps_ddp": isinstance(
            prepared._orig_mod, nn.parallel.DistributedDataParallel
        ),
    }


def _direct_loader_rng() -> dict:
    """A DataLoaderShard built directly with rng_types: every process gets the main
    process's torch RNG and generator when an epoch starts, as with accelerate's."""
    from accel.data_loader import DataLoaderShard
    from accel_state import PartialState

    rank = PartialState().process_index
    torch.manual_seed(100 + rank)  # the ranks start apart
    gen = torch.Generator().manual_seed(200 + rank)
    loader = DataLoaderShard(
        list(range(8)), batch_size=4, shuffle=True, generator=gen,
        rng_types=["torch", "generator"], synchronized_generator=gen,
    )  # fmt: skip
    order = [b.tolist() for b in loader]
    return {"order": order, "draw": torch.rand(1).item()}


def _all(offload_root: str) -> dict:
    import os

    from accel_state import PartialState

    rank = PartialState().process_index
    return {
        "uneven": _uneven_inputs(),
        "placement": _placement_and_dispatch(os.path.join(offload_root, str(rank))),
        "compiled": _compiled_unwrap(),
        "direct_rng": _direct_loader_rng(),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_distributed(_all, str(tmp_path_factory.mktemp("offload")), world_size=2)


def test_join_uneven_inputs_trains_unequal_shares_without_hanging(results) -> None:
    r0, r1 = results[0]["uneven"], results[1]["uneven"]
    assert (r0["batches"], r1["batches"]) == (3, 2)  # each rank its own share, no padding
    assert r0["inside"] is False and r0["after"] is True  # the loader's setting comes back
    torch.testing.assert_close(r0["weight"], r1["weight"])  # the ranks agree at the end


def test_device_placement_false_keeps_the_model_where_it_is(results) -> None:
    assert results[0]["placement"]["kept_device"] == "cpu"


def test_a_model_dispatched_over_several_devices_is_refused_under_ddp(results) -> None:
    message = results[0]["placement"]["dispatched_error"]
    assert "dispatched over several devices (['cpu', 'disk'])" in message
    assert "local_process_index" in message


def test_unwrap_model_of_a_compiled_ddp_model(results) -> None:
    assert results[0]["compiled"] == {
        "kept": True,  # keep_torch_compile=True: the user's module, compiled
        "same_output": True,
        "plain": True,
        "training_model_keeps_ddp": True,
    }


def test_a_dispatched_model_keeps_its_placement_on_one_process(tmp_path) -> None:
    from accel import Accelerator, AcceleratorState
    from accel.big_modeling import dispatch_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    x = torch.randn(2, 3)
    want = model(x)
    model = dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir=tmp_path)
    try:
        acc = Accelerator(cpu=True)
        assert acc.verify_device_map(model) and not acc.verify_device_map(nn.Linear(2, 2))
        prepared = acc.prepare(model)
        assert prepared[1].weight.device.type == "meta"  # still offloaded, not collapsed
        torch.testing.assert_close(prepared(x), want)
    finally:
        AcceleratorState._reset_state()


def test_a_direct_loader_synchronizes_its_rng_types_at_epoch_start(results) -> None:
    r0, r1 = results[0]["direct_rng"], results[1]["direct_rng"]
    assert r0["order"] == r1["order"]  # the generator came from the main process
    assert r0["draw"] == r1["draw"]  # and so did torch's global RNG
