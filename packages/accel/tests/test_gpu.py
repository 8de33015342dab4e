"""The Accelerator on a CUDA GPU: fp16 loss scaling, bf16, exact resume, and NCCL in one process.

Each case runs in a fresh spawned process (as a launched script would), so CUDA state, RNG and
the process group start clean; skipped without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from _models import RegressionData, loss_of, make_model

from accel_state.testing import run_distributed

pytestmark = pytest.mark.gpu


def _fp16_overflow_skips() -> dict:
    from accel import Accelerator, GradScalerKwargs

    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    data = RegressionData(8)
    batch = {"x": data.x.to(acc.device), "y": data.y.to(acc.device)}
    before = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    with acc.autocast():
        half = (batch["x"] @ batch["x"].T).dtype  # the prepared model's outputs are fp32
        loss = loss_of(model, batch) * float("inf")
    acc.backward(loss)
    opt.step()
    sched.step()
    opt.zero_grad()
    skipped = acc.optimizer_step_was_skipped
    unchanged = all(torch.equal(v, before[k]) for k, v in acc.get_state_dict(model).items())
    result = {
        "device": str(next(model.parameters()).device),
        "autocast_dtype": str(half),
        "skipped": skipped,
        "unchanged": unchanged,
        "lr_after_skip": sched.get_last_lr(),
        "scale_after_skip": acc.precision.scaler.get_scale(),
    }
    losses = []
    for _ in range(20):
        with acc.autocast():
            loss = loss_of(model, batch)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    result["first_skipped_again"] = acc.optimizer_step_was_skipped
    result["losses"] = losses
    result["lr_after_steps"] = sched.get_last_lr()
    return result


def test_fp16_on_cuda_overflow_skips_the_step_then_trains():
    (r,) = run_distributed(_fp16_overflow_skips, world_size=1, timeout=180)
    assert r["device"].startswith("cuda") and r["autocast_dtype"] == "torch.float16"
    assert r["skipped"] and r["unchanged"]
    assert r["lr_after_skip"] == [0.1] and r["scale_after_skip"] == 512.0
    assert not r["first_skipped_again"]
    assert r["losses"][-1] < 0.5 * r["losses"][0], r["losses"]


def _bf16_trains() -> dict:
    from accel import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    data = RegressionData(64)
    x, y = data.x.to(acc.device), data.y.to(acc.device)
    with acc.autocast():
        inner = (x @ x.T).dtype
    losses = []
    for _ in range(40):
        with acc.autocast():
            loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"inner": str(inner), "out": str(model(x).dtype), "losses": losses}


def test_bf16_on_cuda_autocasts_inside_and_returns_fp32():
    (r,) = run_distributed(_bf16_trains, world_size=1, timeout=180)
    assert r["inner"] == "torch.bfloat16" and r["out"] == "torch.float32"
    assert r["losses"][-1] < 0.2 * r["losses"][0], r["losses"]


class _Progress:
    def __init__(self) -> None:
        self.epoch, self.micro = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "micro": self.micro}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.micro = state["epoch"], state["micro"]


def _resume_run(project: str, stop_after: int | None, resume: bool, backend: str | None) -> dict:
    """2 epochs: shuffle, 2 loader workers, dropout on CUDA, accumulation 2, fp16, a decaying LR.
    Stop and save after micro-step `stop_after`, or resume from the newest checkpoint. With
    `backend`, a one-process group of that backend (NCCL) is made first and adopted."""
    import torch.distributed as dist

    from accel import Accelerator, ProjectConfiguration
    from accel.utils import set_seed

    if backend:
        torch.cuda.set_device(0)
        dist.init_process_group(backend, device_id=torch.device("cuda", 0))
    set_seed(0)
    acc = Accelerator(
        mixed_precision="fp16",
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True),
    )
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    loader = DataLoader(RegressionData(40), batch_size=4, shuffle=True, num_workers=2)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    progress = _Progress()
    acc.register_for_checkpointing(progress)
    if resume:
        acc.load_state()
    seen: list[int] = []
    while progress.epoch < 2:
        for batch in loader:
            with acc.accumulate(model):
                with acc.autocast():
                    loss = loss_of(model, batch)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            seen.extend(batch["index"].tolist())
            progress.micro += 1
            if progress.micro == stop_after:
                acc.save_state()
                return {"seen": seen}
        progress.epoch += 1
    weights = {k: v.detach().cpu().clone() for k, v in acc.get_state_dict(model).items()}
    return {
        "seen": seen,
        "weights": weights,
        "lr": sched.get_last_lr(),
        "scale": acc.precision.scaler.get_scale(),
        "device": str(acc.device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
    }


@pytest.mark.parametrize("backend", [None, "nccl"])
def test_resume_on_cuda_equals_the_uninterrupted_run_bit_for_bit(tmp_path, backend):
    root = str(tmp_path)
    (full,) = run_distributed(_resume_run, f"{root}/full", None, False, backend, world_size=1)
    for stop in (3, 7):  # mid-accumulation in epoch 0, and in epoch 1
        (first,) = run_distributed(
            _resume_run, f"{root}/{stop}", stop, False, backend, world_size=1
        )
        (rest,) = run_distributed(_resume_run, f"{root}/{stop}", None, True, backend, world_size=1)
        assert first["seen"] + rest["seen"] == full["seen"]
        assert rest["lr"] == full["lr"] and rest["scale"] == full["scale"]
        for k, v in full["weights"].items():
            assert torch.equal(rest["weights"][k], v), k
    assert full["device"].startswith("cuda") and full["backend"] == backend


def _nccl_collectives() -> dict:
    import torch.distributed as dist

    from accel import Accelerator
    from accel.utils import broadcast, gather_object

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    acc = Accelerator()
    t = torch.arange(6, device=acc.device, dtype=torch.float32).view(2, 3)
    acc.wait_for_everyone()
    return {
        "backend": dist.get_backend(),
        "state": (acc.num_processes, acc.process_index, str(acc.device)),
        "gather": acc.gather(t).cpu(),
        "reduce": acc.reduce(t, "sum").cpu(),
        "mean": acc.reduce(t, "mean").cpu(),
        "pad": acc.pad_across_processes(t, dim=0).cpu(),
        "broadcast": broadcast(t.clone()).cpu(),
        "objects": gather_object({"rank": acc.process_index}),
        "metrics": acc.gather_for_metrics(t).cpu(),
    }


def test_nccl_process_group_in_one_process_runs_the_collectives():
    (r,) = run_distributed(_nccl_collectives, world_size=1, timeout=180)
    t = torch.arange(6, dtype=torch.float32).view(2, 3)
    assert r["backend"] == "nccl" and r["state"] == (1, 0, "cuda:0")
    for key in ("gather", "reduce", "mean", "pad", "broadcast", "metrics"):
        assert torch.equal(r[key], t), key
    assert r["objects"] == [{"rank": 0}]


def _fsdp2_bf16_on_cuda(folder: str) -> dict:
    import torch.distributed as dist

    from accel import Accelerator, FullyShardedDataParallelPlugin

    acc = Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    data = RegressionData(64)
    x, y = data.x.to(acc.device), data.y.to(acc.device)
    losses = []
    for _ in range(30):
        loss = nn.functional.mse_loss(model(x).float(), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    acc.save_state(folder)
    before = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    acc.load_state(folder)
    after = acc.get_state_dict(model)
    return {
        "backend": dist.get_backend(),
        "fsdp2": acc.is_fsdp2,
        "device": str(next(model.parameters()).device),
        "losses": losses,
        "restored": all(torch.equal(after[k], v) for k, v in before.items()),
    }


def test_fsdp2_with_bf16_and_nccl_trains_and_round_trips_a_sharded_checkpoint(tmp_path):
    (r,) = run_distributed(_fsdp2_bf16_on_cuda, str(tmp_path / "ckpt"), world_size=1, timeout=240)
    assert r["backend"] == "nccl" and r["fsdp2"] and r["device"].startswith("cuda")
    assert r["losses"][-1] < 0.2 * r["losses"][0], r["losses"]
    assert r["restored"]


def _placement_on_cuda() -> dict:
    from accel import Accelerator
    from accel.big_modeling import dispatch_model

    acc = Accelerator()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    want = model(x)
    model = dispatch_model(model, {"0": 0, "1": "cpu"})  # layer 1 offloaded, runs on cuda:0
    prepared = acc.prepare(model)
    kept = Accelerator(device_placement=False).prepare(nn.Linear(2, 2))
    return {
        "device": str(acc.device),
        "first": str(prepared[0].weight.device),
        "second_offloaded": prepared[1].weight.device.type == "meta",
        "close": torch.allclose(prepared(x.to(acc.device)).cpu(), want, atol=1e-5),
        "kept": str(kept.weight.device),
    }


def test_prepare_keeps_a_dispatched_model_and_device_placement_false_on_cuda():
    (r,) = run_distributed(_placement_on_cuda, world_size=1, timeout=180)
    assert r == {
        "device": "cuda:0",
        "first": "cuda:0",
        "second_offloaded": True,
        "close": True,
        "kept": "cpu",
    }


def _deepspeed_on_cuda() -> dict:
    from accel import Accelerator
    from accel.state import AcceleratorState
    from accel.utils import DeepSpeedPlugin

    def data():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(64, 8, generator=g)
        return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    ref = net().cuda()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for x, y in DataLoader(data(), batch_size=16):
        nn.functional.mse_loss(ref(x.cuda()), y.cuda()).backward()
        opt.step()
        opt.zero_grad()
    want = {k: v.float().cpu() for k, v in ref.state_dict().items()}
    out = {}
    for stage, mode in ((2, "no"), (3, "no"), (2, "bf16")):
        AcceleratorState._reset_state(reset_partial_state=False)
        plugin = DeepSpeedPlugin(zero_stage=stage, zero3_save_16bit_model=True)
        acc = Accelerator(mixed_precision=mode, deepspeed_plugin=plugin)
        model = net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=16))
        for x, y in loader:
            acc.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
        got = {k: v.float().cpu() for k, v in acc.get_state_dict(model).items()}
        out[f"zero{stage}-{mode}"] = max(float((got[k] - want[k]).abs().max()) for k in want)
        out["device"] = str(next(acc.unwrap_model(model).parameters()).device)
    return out


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None, reason="needs deepspeed"
)
def test_deepspeed_zero_on_cuda_with_nccl_equals_plain_torch():
    (r,) = run_distributed(_deepspeed_on_cuda, world_size=1, timeout=400)
    assert r["device"] == "cuda:0"
    assert r["zero2-no"] < 1e-5 and r["zero3-no"] < 1e-5, r
    assert r["zero2-bf16"] < 5e-2, r  # bf16 engine: close to the fp32 run


def _transformers_dispatch_on_cuda(folder: str) -> dict:
    import accel

    accel.use_as_accelerate()
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    plain = AutoModelForCausalLM.from_pretrained(folder).cuda().eval()
    want = plain(ids.cuda()).logits.float().cpu()
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                  "model.layers.2": "disk", "model.layers.3": "disk", "model.norm": 0,
                  "model.rotary_emb": 0, "lm_head": 0}  # fmt: skip
    spread = AutoModelForCausalLM.from_pretrained(
        folder, device_map=device_map, offload_folder=f"{folder}/offload"
    ).eval()
    with torch.no_grad():
        got = spread(ids.cuda()).logits.float().cpu()
        same_generate = torch.equal(
            plain.generate(ids.cuda(), max_new_tokens=8, do_sample=False).cpu(),
            spread.generate(ids.cuda(), max_new_tokens=8, do_sample=False).cpu(),
        )
    return {"max_diff": float((got - want).abs().max()), "generate": same_generate}


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None, reason="needs transformers"
)
def test_transformers_from_pretrained_over_gpu_cpu_and_disk(tmp_path):
    (r,) = run_distributed(_transformers_dispatch_on_cuda, str(tmp_path), world_size=1, timeout=300)
    assert r["max_diff"] < 1e-4 and r["generate"], r
