"""The XLA strategy on XLA's CPU device (one device per process), against eager CPU.

Real torch-xla (``PJRT_DEVICE=CPU``): training with accumulation and clipping ends where plain
PyTorch on the CPU ends, batches arrive on the device through torch-xla's parallel loader and
resume exactly, the collectives, checkpoints that load on the CPU engine and back, bf16, and
the refusals. SPMD over several devices: test_xla_spmd.py (it needs the runtime in SPMD mode
from the start, so it runs in a process of its own). What needs several XLA replicas is
marked ``tpu``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _xla_cases import (
    ACCUMULATE,
    BATCH,
    BOUND,
    CLIP,
    SAMPLES,
    dataset,
    eager_reference,
    loader,
    make_net,
    make_optimizer,
    skip_without_xla_cpu,
    train_accelerated,
)

from accel import Accelerator, DistributedType
from accel_testkit.tolerance import assert_same_losses, assert_same_training, float32_error

pytestmark = skip_without_xla_cpu


def test_training_on_xla_equals_eager_cpu() -> None:
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATE)
    assert accelerator.distributed_type == DistributedType.XLA
    assert accelerator.device.type == "xla"
    assert accelerator.strategy.name == "xla"  # chosen: an XLA device is present
    got, want = train_accelerated(accelerator), eager_reference()
    assert got["devices"] == {"xla"}, "batches must arrive on the XLA device"
    assert {p.device.type for p in got["model"].parameters()} == {"xla"}
    assert all(p.device.type == "xla" for g in got["optimizer"].param_groups for p in g["params"])
    assert min(want["norms"]) > CLIP, "the reference never clips: the clip is not checked"
    for a, b in zip(got["norms"], want["norms"]):
        assert abs(a - b) <= BOUND * b
    assert_same_losses(got["losses"], want["losses"], float32_error(3, 16), BOUND)
    assert all(t.device.type == "cpu" for t in got["state"].values())  # on the host
    assert_same_training(got["state"], want["state"], make_net().state_dict(), BOUND)


def test_opt_out_and_cpu_keep_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    accelerator = Accelerator()
    assert accelerator.device.type == "cpu"
    assert accelerator.distributed_type == DistributedType.NO


def test_loader_feeds_the_device_and_resumes_exactly(tmp_path: Path) -> None:
    accelerator = Accelerator()
    data = accelerator.prepare(loader())
    assert data.total_batch_size == BATCH
    seen = []
    for i, (x, _) in enumerate(data):
        assert x.device.type == "xla"
        seen.append(x.cpu())
        if i == 2:
            accelerator.save_state(tmp_path / "mid")
            break
    rest = [x.cpu() for x, _ in data]  # the whole epoch, unshuffled: what a resume continues
    assert len(rest) == SAMPLES // BATCH
    accelerator.load_state(tmp_path / "mid")
    resumed = [x.cpu() for x, _ in data]
    assert len(resumed) == SAMPLES // BATCH - 3
    torch.testing.assert_close(torch.cat(resumed), torch.cat(rest[3:]), rtol=0, atol=0)
    skipped = [x.cpu() for x, _ in accelerator.skip_first_batches(data, 4)]
    torch.testing.assert_close(torch.cat(skipped), torch.cat(rest[4:]), rtol=0, atol=0)
    data.set_epoch(5)  # accel-data's epoch bookkeeping is unchanged by the feeder
    assert len(list(data)) == SAMPLES // BATCH


def test_collectives_on_one_replica() -> None:
    accelerator = Accelerator()
    t = torch.arange(4.0, device=accelerator.device)
    assert accelerator.gather(t).device.type == "xla"
    torch.testing.assert_close(accelerator.gather(t).cpu(), torch.arange(4.0))
    torch.testing.assert_close(accelerator.reduce(t, "mean").cpu(), torch.arange(4.0))
    torch.testing.assert_close(accelerator.pad_across_processes(t).cpu(), torch.arange(4.0))
    from accel.utils import broadcast

    torch.testing.assert_close(broadcast(t).cpu(), torch.arange(4.0))
    with pytest.raises(NotImplementedError, match="gather objects in TPU is not supported"):
        accelerator.gather_for_metrics(["a"], use_gather_object=True)


def test_checkpoints_move_between_xla_and_cpu(tmp_path: Path) -> None:
    """save_state on XLA resumes on the CPU engine, and the reverse: the same files."""
    from accel_state import PartialState

    accelerator = Accelerator()
    model, opt = accelerator.prepare(*_model_and_optimizer())
    x = torch.randn(BATCH, 8)
    accelerator.backward(model(x.to(accelerator.device)).square().mean())
    opt.step()
    saved = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    momentum = [opt.state[p]["momentum_buffer"].cpu() for p in model.parameters()]
    accelerator.save_state(tmp_path / "xla")
    assert "xm_seed" in torch.load(tmp_path / "xla" / "random_states_0.pkl", weights_only=False)

    PartialState._reset_state()
    cpu = Accelerator(cpu=True)
    cpu_model, cpu_opt = cpu.prepare(*_model_and_optimizer())
    cpu.load_state(tmp_path / "xla")
    for k, v in cpu_model.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)
    for p, m in zip(cpu_model.parameters(), momentum):
        torch.testing.assert_close(cpu_opt.state[p]["momentum_buffer"], m, rtol=0, atol=0)
    cpu.backward(cpu_model(x).square().mean())
    cpu_opt.step()
    after_cpu = {k: v.clone() for k, v in cpu_model.state_dict().items()}
    cpu.save_state(tmp_path / "cpu")

    PartialState._reset_state()
    back = Accelerator()
    xla_model, xla_opt = back.prepare(*_model_and_optimizer())
    back.load_state(tmp_path / "cpu")
    for k, v in back.get_state_dict(xla_model).items():
        torch.testing.assert_close(v, after_cpu[k], rtol=0, atol=0)
    assert all(
        xla_opt.state[p]["momentum_buffer"].device.type == "xla" for p in xla_model.parameters()
    )


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = make_net()
    return model, make_optimizer(model)


def test_bf16_autocasts_on_xla() -> None:
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(make_net())
    x = torch.randn(BATCH, 8)
    out = model(x.to(accelerator.device)).float().cpu()  # outputs come back in float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = make_net()(x).float()
    full = make_net()(x)
    # bfloat16 keeps 8 bits of mantissa: each of the 3 layers' matmuls rounds its inputs and
    # output to 2**-8 relative, so bf16 is that far from float32, and XLA's bf16 and eager
    # CPU's bf16 agree to about as much (other summation orders, other rounding points)
    scale = float(full.abs().max())
    assert float((out - full).abs().max()) > 1e-5 * scale, "the forward ran in float32"
    torch.testing.assert_close(out, want, rtol=0, atol=6 * 2**-8 * scale)


def test_fp16_is_refused_on_xla() -> None:
    with pytest.raises(ValueError, match=r"mixed_precision='fp16' .* use mixed_precision='bf16'"):
        Accelerator(mixed_precision="fp16")


def test_an_optimizer_without_its_model_is_refused() -> None:
    accelerator = Accelerator()
    model = make_net()
    opt = make_optimizer(model)
    accelerator.prepare(model)
    with pytest.raises(ValueError, match="pass the model together with its optimizer"):
        accelerator.strategy.prepare([], [opt])


_REPLICA_SCRIPT = """
import sys, torch, torch_xla
sys.path.insert(0, {tests!r})
from _xla_cases import train_accelerated
from accel import Accelerator

def main(index):
    accelerator = Accelerator(gradient_accumulation_steps={accumulate})
    got = train_accelerated(accelerator)
    if accelerator.is_main_process:
        torch.save(dict(state=got["state"], world=accelerator.num_processes), {out!r})

if __name__ == "__main__":
    torch_xla.launch(main)
"""


@pytest.mark.tpu
def test_replicas_reduce_gradients_once(tmp_path: Path) -> None:
    """Every replica of a TPU host trains its share of each batch (torch_xla.launch): the
    gradients are averaged once per step, so the run ends where eager CPU on the whole batches
    ends, whatever the number of replicas. Needs several XLA replicas: a TPU."""
    import subprocess
    import sys

    out = tmp_path / "state.pt"
    script = tmp_path / "replicas.py"
    tests = str(Path(__file__).parent)
    script.write_text(_REPLICA_SCRIPT.format(tests=tests, accumulate=ACCUMULATE, out=str(out)))
    subprocess.run([sys.executable, str(script)], check=True, timeout=600)
    result = torch.load(out, weights_only=True)
    assert result["world"] > 1
    bound = BOUND * result["world"]  # the all-reduce adds one more sum of `world` terms
    assert_same_training(
        result["state"], eager_reference()["state"], make_net().state_dict(), bound
    )


def test_set_seed_seeds_the_xla_generator() -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm

    from accel.utils import set_seed

    device = torch_xla.device()

    def draw() -> torch.Tensor:
        values = torch.rand(64, device=device)
        torch_xla.sync()
        return values.cpu()

    set_seed(7)
    assert xm.get_rng_state(device) == 7  # accelerate's xm.set_rng_state(seed)
    first = draw()
    set_seed(7)
    torch.testing.assert_close(draw(), first, rtol=0, atol=0)
    set_seed(8)
    assert not torch.equal(draw(), first)


def _data_handles_of_a_step(step: Any) -> int:
    """The device buffers one steady-state step creates (graph results and transfers), after
    two steps that compile its graphs."""
    import torch_xla.debug.metrics as met

    for _ in range(2):
        step()
    before = met.counter_value("CreateDataHandles") or 0
    step()
    return (met.counter_value("CreateDataHandles") or 0) - before


def test_the_step_graph_writes_the_parameters_not_the_gradients() -> None:
    """A graph cut materializes every live tensor it computed: cut while the gradients are
    held (at `optimizer.step()`), the step's graph wrote each gradient out as well, an extra
    buffer per parameter that raw torch-xla's loop (cut after `zero_grad`) never writes. The
    cut now comes at the prepared optimizer's `zero_grad`: a step creates exactly the buffers
    of raw torch-xla's, and a step whose gradients are released some other way is still cut
    (by the next optimizer step)."""
    import torch_xla
    import torch_xla.debug.metrics as met

    x, y = dataset().tensors[0][:BATCH], dataset().tensors[1][:BATCH]
    device = torch_xla.device()
    raw_model = make_net().to(device)
    raw_opt = make_optimizer(raw_model)

    def raw_step() -> None:
        loss = torch.nn.functional.mse_loss(raw_model(x.to(device)), y.to(device))
        loss.backward()
        raw_opt.step()
        raw_opt.zero_grad()
        torch_xla.sync()

    accelerator = Accelerator()
    net = make_net()
    model, opt = accelerator.prepare(net, make_optimizer(net))

    def accel_step(zero_grad: Any) -> None:
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        accelerator.backward(loss)
        opt.step()
        zero_grad()

    def raw_step_cut_with_gradients_held() -> None:
        loss = torch.nn.functional.mse_loss(raw_model(x.to(device)), y.to(device))
        loss.backward()
        raw_opt.step()
        torch_xla.sync()  # where accel used to cut: the gradients are still held
        raw_opt.zero_grad()

    raw = _data_handles_of_a_step(raw_step)
    # the count sees the gradients a cut writes out (the parameters' updates may reuse their
    # donated buffers, so they need not count)
    assert _data_handles_of_a_step(raw_step_cut_with_gradients_held) > raw
    assert _data_handles_of_a_step(lambda: accel_step(opt.zero_grad)) == raw
    cuts = met.counter_value("MarkStep")
    for _ in range(3):
        accel_step(model.zero_grad)  # the prepared optimizer's zero_grad is never called
    assert met.counter_value("MarkStep") - cuts >= 2, "the steps' graphs were never cut"
