"""Step metrics (`Accelerator(log_step_metrics=True)`): FLOPs against the analytic count,
samples and tokens of whole optimizer steps, trackers, the printed line, the launch flag,
and no calls at all when off. One 2-process gloo launch checks DDP, FSDP2 and pp=2; one real
`accel launch --step_metrics` checks the flag reaches both workers."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from accel import Accelerator, AcceleratorState, StepMetricsKwargs, _flops, _step_metrics
from accel._step_metrics import METRIC_KEYS
from accel_state.testing import run_distributed
from accel_testkit.models import Stack

IN, WIDTH, HIDDEN, DEPTH = 8, 32, 64, 2
# The spec's bound: counted FLOPs within 5% of the analytic count.
FLOPS_RTOL = 0.05


def make_stack() -> Stack:
    torch.manual_seed(0)
    return Stack(width=WIDTH, depth=DEPTH, hidden=HIDDEN, in_features=IN)


def stack_flops(samples: int) -> int:
    """Analytic FLOPs of a forward + backward of `samples` rows through the Stack's linear
    layers: 2 per multiply-add in the forward, the same for the weight gradients and for the
    input gradients (6 x weights x rows), less the first layer's input gradient, which is not
    computed (the data needs none). Biases, tanh and the loss are not matmuls."""
    model = make_stack()
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6 * weights * samples - 2 * model.inp.weight.numel() * samples


def regression_loader(rows: int, batch_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(rows, IN, generator=g), torch.randn(rows, 1, generator=g))
    return DataLoader(data, batch_size=batch_size)


def train(acc: Accelerator, model: nn.Module, loader: Any, opt: Any) -> list[dict]:
    seen = []
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            if acc.sync_gradients:
                seen.append(acc.step_metrics)
    return seen


def stack_run(accum: int = 1, **kwargs: Any) -> tuple[Accelerator, list[dict]]:
    acc = Accelerator(cpu=True, gradient_accumulation_steps=accum, **kwargs)
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, regression_loader(24, 4))
    return acc, train(acc, model, loader, opt)


def test_mlp_flops_equal_the_analytic_count_and_accumulation_counts_the_whole_step() -> None:
    acc, steps = stack_run(accum=3, log_step_metrics=True)
    assert len(steps) == 2  # 6 batches of 4, 3 per optimizer step
    for metrics in steps:
        assert set(METRIC_KEYS) <= set(metrics)
        assert metrics["flops_per_step"] == pytest.approx(stack_flops(12), rel=FLOPS_RTOL)
        seconds = metrics["step_time_sec"]
        assert metrics["samples_per_sec"] * seconds == pytest.approx(12)  # 3 micro-batches of 4
        assert metrics["tokens_per_sec"] is None  # the batches have no input_ids
        assert metrics["tflops_per_sec"] == pytest.approx(
            metrics["flops_per_step"] / seconds / 1e12
        )
        assert metrics["mfu"] == pytest.approx(
            metrics["flops_per_step"] / seconds / acc._step_metrics.peak.flops_per_sec
        )
        assert 0 <= metrics["data_wait_fraction"] <= 1
        assert metrics["peak_memory_bytes"] > 0
    assert acc._step_metrics.peak.source == "measured"  # a CPU: probed, not from the table


class TokenData(Dataset):
    """Token batches with padding: row i has 5 + i % 4 real tokens of 8."""

    def __init__(self, rows: int, length: int = 8, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, vocab, (rows, length), generator=g)
        self.mask = (torch.arange(length) < (5 + torch.arange(rows) % 4)[:, None]).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.ids[i]}


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def llama_flops(model: nn.Module, batch: int, length: int) -> int:
    """6 x dense weights (every 2-D weight but the embedding lookup) x tokens, plus attention:
    QK^T and AV are 2 x 2 x batch x length^2 x hidden per layer forward, twice that backward."""
    dense = sum(
        p.numel() for n, p in model.named_parameters() if p.ndim == 2 and "embed_tokens" not in n
    )
    config = model.config
    attention = 3 * 4 * batch * length**2 * config.hidden_size * config.num_hidden_layers
    return 6 * dense * batch * length + attention


@pytest.mark.needs("transformers")
def test_llama_flops_equal_the_analytic_count_and_tokens_follow_the_mask() -> None:
    acc = Accelerator(cpu=True, log_step_metrics=True, gradient_accumulation_steps=2)
    data = TokenData(8)
    model = tiny_llama()
    analytic = llama_flops(model, batch=2, length=8) * 2  # two micro-batches of 2 rows
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=2))
    seen, real = [], data.mask.sum(dim=1).tolist()
    for batch in loader:
        with acc.accumulate(model):
            acc.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
            if acc.sync_gradients:
                seen.append(acc.step_metrics)
    assert len(seen) == 2
    for step, metrics in enumerate(seen):
        assert metrics["flops_per_step"] == pytest.approx(analytic, rel=FLOPS_RTOL)
        seconds = metrics["step_time_sec"]
        assert metrics["tokens_per_sec"] * seconds == pytest.approx(
            sum(real[4 * step : 4 * step + 4])
        )
        assert metrics["samples_per_sec"] * seconds == pytest.approx(4)


def test_user_counts_replace_the_batch_counts() -> None:
    acc = Accelerator(cpu=True, log_step_metrics=True)
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, regression_loader(8, 4))
    acc.count_step_tokens(10)  # outside a step: counted in the first one
    for x, y in loader:
        acc.count_step_tokens(100, samples=3)
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        seconds = acc.step_metrics["step_time_sec"]
        counted = acc.step_metrics["tokens_per_sec"] * seconds
        assert counted == pytest.approx(110 if acc._step_metrics.steps == 1 else 100)
        assert acc.step_metrics["samples_per_sec"] * seconds == pytest.approx(3)


@pytest.mark.needs("matplotlib")
def test_metrics_reach_the_jsonl_tracker_and_a_png(tmp_path) -> None:
    from accel_tracking import plot_step_metrics, read_jsonl

    acc, steps = stack_run(log_step_metrics=True, log_with="jsonl", project_dir=tmp_path)
    assert len(steps) == 6  # before init_trackers: no tracker yet, nothing logged, no error
    acc.init_trackers("run")
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, regression_loader(12, 4))
    train(acc, model, loader, opt)
    acc.end_training()
    records = [r for r in read_jsonl(tmp_path / "run") if "perf/mfu" in r["values"]]
    assert [r["step"] for r in records] == [7, 8, 9]  # 6 steps before, 3 after init_trackers
    assert records[-1]["values"]["perf/flops_per_step"] == stack_flops(4)
    png = plot_step_metrics(tmp_path / "run")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_line_every_print_every_steps(capsys: pytest.CaptureFixture[str]) -> None:
    stack_run(kwargs_handlers=[StepMetricsKwargs(print_every=2)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split(" |")[0] for ln in lines] == ["step 2", "step 4", "step 6"]
    assert all("samples/s" in ln and "TFLOP/s" in ln and "of measured peak" in ln for ln in lines)
    assert all("data wait" in ln and "GiB" in ln for ln in lines)


def test_off_makes_no_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        return wrapper

    cls = _step_metrics.StepMetrics
    for name in ("timed", "_forward_pre_hook", "backward_done", "optimizer_stepped", "count"):
        monkeypatch.setattr(cls, name, counted(name, getattr(cls, name)))
    for name in ("device_peak_flops", "flop_counter"):
        monkeypatch.setattr(_flops, name, counted(name, getattr(_flops, name)))
    monkeypatch.setattr(
        _step_metrics, "batch_counts", counted("batch_counts", _step_metrics.batch_counts)
    )

    acc, steps = stack_run()
    acc.count_step_tokens(5)
    assert calls == {} and acc.step_metrics == {} and acc._step_metrics is None
    assert not acc._models[0]._forward_pre_hooks  # nothing wired into the prepared objects
    assert acc._optimizers[0].step_observer is None and acc._dataloaders[0].step_metrics is None
    AcceleratorState._reset_state()
    stack_run(log_step_metrics=True)
    assert set(calls) == {
        "timed", "_forward_pre_hook", "backward_done", "optimizer_stepped", "device_peak_flops",
        "flop_counter", "batch_counts",
    }  # fmt: skip
    assert calls["flop_counter"] == 2  # one input shape: counted twice (the same), then cached


def test_launch_flag_turns_them_on_and_the_code_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    launched = {"cpu": True, "step_metrics": True, "explicit": ["step_metrics"]}
    monkeypatch.setenv("ACCEL_LAUNCH_CONFIG", json.dumps(launched))
    assert Accelerator()._step_metrics is not None
    AcceleratorState._reset_state()
    with pytest.warns(UserWarning, match="step_metrics=False"):
        assert Accelerator(log_step_metrics=False)._step_metrics is None


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"print_every=-1.*>= 0"):
        StepMetricsKwargs(print_every=-1)
    with pytest.raises(ValueError, match="contradicts"):
        Accelerator(cpu=True, log_step_metrics=False, kwargs_handlers=[StepMetricsKwargs()])


def test_peak_table_by_device_name_and_dtype() -> None:
    assert _flops.table_peak("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert _flops.table_peak("NVIDIA H100 PCIe", "bf16") == pytest.approx(756.5e12)
    assert _flops.table_peak("NVIDIA A100-SXM4-80GB", "tf32") == pytest.approx(156e12)
    assert _flops.table_peak("NVIDIA A10G", "fp16") == pytest.approx(70e12)
    assert _flops.table_peak("NVIDIA A10", "fp16") == pytest.approx(125e12)
    assert _flops.table_peak("NVIDIA L40S", "fp8") == pytest.approx(733e12)
    assert _flops.table_peak("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 tensor cores
    assert _flops.table_peak("Some Future GPU", "bf16") is None
    peak = _flops.device_peak_flops(torch.device("cpu"), "fp32")
    assert (
        peak.source == "measured" and math.isfinite(peak.flops_per_sec) and peak.flops_per_sec > 0
    )
    assert _flops.compute_dtype("bf16", torch.device("cpu")) == "bf16"
    assert _flops.compute_dtype("no", torch.device("cpu")) in ("fp32", "tf32")


# -- two gloo processes: DDP and FSDP2 in one launch ------------------------------------------
def _distributed_variant(fsdp: bool) -> list[dict]:
    from accel import FullyShardedDataParallelPlugin

    AcceleratorState._reset_state()  # the process group stays; the next Accelerator adopts it
    plugin = FullyShardedDataParallelPlugin() if fsdp else None
    acc = Accelerator(
        cpu=True, log_step_metrics=True, gradient_accumulation_steps=2, fsdp_plugin=plugin
    )
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, regression_loader(32, 4))
    assert acc.is_fsdp2 == fsdp
    return train(acc, model, loader, opt)


def _deepspeed_variant() -> list[dict] | None:
    """ZeRO-2 through DeepSpeed (the engine owns backward and step): the same figures."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return None
    from accel.utils import DeepSpeedPlugin

    AcceleratorState._reset_state()
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=2)
    acc = Accelerator(cpu=True, log_step_metrics=True, deepspeed_plugin=plugin)
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, regression_loader(32, 4))
    return train(acc, model, loader, opt)


def _pipeline_variant() -> list[dict]:
    """pp=2, 1F1B over 2 micro-batches: each rank counts its stage's FLOPs."""
    from accel import ParallelismConfig

    AcceleratorState._reset_state()
    config = ParallelismConfig(
        pp_size=2, pp_schedule="1F1B", pp_plan=["inp", "blocks", "out"],
        pp_loss_fn=nn.functional.mse_loss, pp_microbatches=2,
    )  # fmt: skip
    acc = Accelerator(cpu=True, log_step_metrics=True, parallelism_config=config)
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, regression_loader(32, 8))
    seen = []
    for x, y in loader:
        acc.backward(model(x, labels=y).loss)
        opt.step()
        opt.zero_grad()
        seen.append(acc.step_metrics)
    return seen


def _distributed_checks() -> dict[str, list[dict]]:
    return {
        "ddp": _distributed_variant(False),
        "fsdp2": _distributed_variant(True),
        "zero2": _deepspeed_variant(),
        "pp": _pipeline_variant(),
    }


def test_ddp_fsdp2_zero2_and_pipeline_count_each_global_step_once() -> None:
    results = run_distributed(_distributed_checks, world_size=2, timeout=300)
    # pp=2: 4 steps of 8 rows (one data-parallel rank). Each rank counts its own stage and
    # scales it by the 2 processes: within 5% of the whole model's count (the stages differ
    # by the first layer's missing input gradient and the head), and the two ranks' own
    # counts add up to it exactly. The first step also holds the schedule's shape inference.
    pipeline = [r.pop("pp") for r in results]
    for step in range(1, 4):
        figures = [steps[step] for steps in pipeline]
        assert sum(f["flops_per_step"] for f in figures) // 2 == stack_flops(8)
        for rank, metrics in enumerate(figures):
            where = f"rank {rank}, pp step {step}"
            assert metrics["flops_per_step"] == pytest.approx(stack_flops(8), rel=FLOPS_RTOL), where
            assert metrics["samples_per_sec"] * metrics["step_time_sec"] == pytest.approx(8), where
    # 32 rows, 4 per batch per process, 2 micro-batches per step: 2 steps of 16 rows in all
    for rank, result in enumerate(results):
        if result["zero2"] is None:  # DeepSpeed is not installed (a leaf's own environment)
            del result["zero2"]
        for engine, steps in result.items():
            assert len(steps) == 2, (rank, engine)
            for metrics in steps:
                where = f"rank {rank}, {engine}"
                assert metrics["flops_per_step"] == pytest.approx(
                    stack_flops(16), rel=FLOPS_RTOL
                ), where
                seconds = metrics["step_time_sec"]
                assert metrics["samples_per_sec"] * seconds == pytest.approx(16), where
                assert metrics["rank_samples_per_sec"] * seconds == pytest.approx(8), where
                rank_flops = metrics["rank_tflops_per_sec"] * 1e12 * seconds
                assert rank_flops == pytest.approx(metrics["flops_per_step"] / 2), where


@pytest.mark.gpu
@pytest.mark.needs("transformers")
def test_bf16_llama_mfu_on_a_gpu_against_the_table_and_by_hand() -> None:
    """The MFU of a bf16 step equals the analytic FLOPs over the step time over the table's
    peak for this GPU (by hand), and the allocator's peaks are reported."""
    acc = Accelerator(mixed_precision="bf16", log_step_metrics=True)
    data = TokenData(16)
    model = tiny_llama()
    analytic = llama_flops(model, batch=4, length=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=4))
    for batch in loader:
        acc.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
    metrics, peak = acc.step_metrics, acc._step_metrics.peak
    name = torch.cuda.get_device_name()
    if _flops.table_peak(name, "bf16") is not None:
        assert peak.source == "table" and peak.flops_per_sec == _flops.table_peak(name, "bf16")
    by_hand = analytic / metrics["step_time_sec"] / peak.flops_per_sec
    assert metrics["mfu"] == pytest.approx(by_hand, rel=FLOPS_RTOL)
    assert metrics["peak_memory_reserved_bytes"] >= metrics["peak_memory_bytes"] > 0


@pytest.mark.gpu
def test_bf16_mlp_step_metrics_on_a_gpu_count_the_flops_and_wait_for_the_kernels() -> None:
    """No transformers needed: a wide Stack in bf16 on cuda:0. FLOPs within the spec's bound of
    the analytic count; the step time covers the GPU's work (the metrics synchronize the
    device before reading the clock: without it, a step of queued matmuls would read as its
    launch time, a fraction of the kernels' time measured by CUDA events); MFU is FLOPs over
    time over the peak (the table's for a listed GPU); the peaks are the caching allocator's."""
    width, rows = 4096, 2048
    torch.manual_seed(0)
    model = Stack(width=width, depth=4, hidden=width, in_features=width, out_features=width)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    analytic = 6 * weights * rows - 2 * model.inp.weight.numel() * rows
    acc = Accelerator(mixed_precision="bf16", log_step_metrics=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(rows, width, device=acc.device)
    seen, gpu_seconds = [], []
    for _ in range(4):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        acc.backward(model(x).float().pow(2).mean())
        opt.step()
        opt.zero_grad()
        end.record()
        seen.append(acc.step_metrics)
        gpu_seconds.append(start.elapsed_time(end) / 1000)  # the metrics synchronized already
    assert str(acc.device).startswith("cuda")
    peak = acc._step_metrics.peak
    name = torch.cuda.get_device_name()
    if _flops.table_peak(name, "bf16") is not None:
        assert peak.source == "table" and peak.flops_per_sec == _flops.table_peak(name, "bf16")
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for metrics, gpu in zip(seen[1:], gpu_seconds[1:]):  # the first step pays the warm-up
        assert metrics["flops_per_step"] == pytest.approx(analytic, rel=FLOPS_RTOL)
        seconds = metrics["step_time_sec"]
        assert seconds >= 0.95 * gpu, (seconds, gpu)
        assert metrics["mfu"] == pytest.approx(analytic / seconds / peak.flops_per_sec, rel=0.06)
        assert 0 < metrics["mfu"] < 1
        # weights and their gradients at least; the allocator reserves what it allocates
        assert metrics["peak_memory_reserved_bytes"] >= metrics["peak_memory_bytes"]
        assert metrics["peak_memory_bytes"] >= 2 * param_bytes


def test_evaluation_between_steps_counts_no_samples_or_flops() -> None:
    acc = Accelerator(cpu=True, log_step_metrics=True)
    model = make_stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader, evaluation = acc.prepare(
        model, opt, regression_loader(12, 4), regression_loader(9, 3)
    )
    for x, y in loader:
        model.eval()
        with torch.no_grad():
            for ex, _ in evaluation:
                model(ex)
        model.train()
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        metrics = acc.step_metrics
        assert metrics["samples_per_sec"] * metrics["step_time_sec"] == pytest.approx(4)
        assert metrics["flops_per_step"] == pytest.approx(stack_flops(4), rel=FLOPS_RTOL)


LAUNCHED_SCRIPT = """
import json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator

acc = Accelerator()
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(80, 8), torch.randn(80, 1))
model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=4))
for x, y in loader:
    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    opt.step()
    opt.zero_grad()
with open(f"{sys.argv[1]}/rank{acc.process_index}.json", "w") as f:
    json.dump(acc.step_metrics, f)
"""


def test_accel_launch_step_metrics_reaches_every_worker(tmp_path) -> None:
    import subprocess

    from accel_testkit.launch import launch_command, worker_env

    script = tmp_path / "train.py"
    script.write_text(LAUNCHED_SCRIPT)
    out = subprocess.run(
        launch_command("--step_metrics", script, tmp_path),
        env=worker_env(drop=("ACCEL_*", "ACCELERATE_*")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # 80 rows, 4 per batch on each of 2 processes: 10 steps; one line, from the main process
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("step ")]
    assert len(lines) == 1 and lines[0].startswith("step 10 | ") and "samples/s" in lines[0]
    for rank in (0, 1):
        metrics = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert metrics["samples_per_sec"] * metrics["step_time_sec"] == pytest.approx(8)
        # Linear(8, 1) on 8 rows in all: forward and weight gradient, no input gradient
        assert metrics["flops_per_step"] == pytest.approx(4 * 8 * 8, rel=FLOPS_RTOL)
