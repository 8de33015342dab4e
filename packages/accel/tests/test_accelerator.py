"""The Accelerator in one process: prepare, accumulation, precision, utilities."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
from _models import RegressionData, assert_same_training, float32_error, loss_of, make_model

import accel
from accel import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    Accelerator,
    AcceleratorState,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    ProfileKwargs,
    find_executable_batch_size,
)


def test_prepare_returns_objects_in_order_and_types() -> None:
    acc = Accelerator(cpu=True)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    loader = DataLoader(RegressionData(8), batch_size=4)
    other = {"not": "prepared"}
    out = acc.prepare(loader, sched, other, opt, model)
    assert isinstance(out[1], AcceleratedScheduler)
    assert out[2] is other
    assert isinstance(out[3], AcceleratedOptimizer)
    assert isinstance(out[4], nn.Module)
    assert [b["index"].tolist() for b in out[0]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert acc.prepare(model) is out[4]  # a single object comes back bare
    assert acc.device == torch.device("cpu") and acc.num_processes == 1
    assert acc.is_main_process and acc.distributed_type == "NO"


def _train_steps(acc: Accelerator, batches: list[slice], data: RegressionData) -> dict:
    model = make_model(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    for rows in batches:
        with acc.accumulate(model):
            acc.backward(loss_of(model, {"x": data.x[rows], "y": data.y[rows]}))
            opt.step()
            opt.zero_grad()
    return {k: v.clone() for k, v in acc.get_state_dict(model).items()}


def test_accumulating_four_micro_batches_equals_one_big_step() -> None:
    data = RegressionData(32)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    micro = [slice(i * 2, i * 2 + 2) for i in range(8)]
    accumulated = _train_steps(acc, micro, data)
    big = _train_steps(Accelerator(cpu=True), [slice(0, 8), slice(8, 16)], data)
    # SGD: the runs differ by float32 rounding alone, 2 steps of 2 layers whose sums add at
    # most 8 terms (4 features, 8 hidden units, 8 rows); see accel_testkit.tolerance
    start = make_model(3).state_dict()
    assert_same_training(accumulated, big, start, 2 * float32_error(layers=2, terms=8))


def test_sync_on_the_last_batch_of_the_dataloader_and_scheduler_count() -> None:
    acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    loader = DataLoader(RegressionData(24), batch_size=4)  # 6 batches: syncs at 4 and 6
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    syncs = []
    for batch in loader:
        with acc.accumulate(model):
            acc.backward(loss_of(model, batch))
            opt.step()
            sched.step()
            opt.zero_grad()
            syncs.append(acc.sync_gradients)
    assert syncs == [False, False, False, True, False, True]
    # two optimizer steps; with adjust_scheduler the count moves on skipped micro-steps too
    assert sched.scheduler._step_count == 1 + 6


def test_accumulation_plugin_and_conflicts() -> None:
    plugin = GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert acc.gradient_accumulation_steps == 3
    with pytest.raises(ValueError, match="disagree"):
        Accelerator(cpu=True, gradient_accumulation_plugin=plugin, gradient_accumulation_steps=5)
    with pytest.raises(ValueError, match="num_steps=0"):
        GradientAccumulationPlugin(num_steps=0)


def test_fp16_overflow_skips_optimizer_and_scheduler_step() -> None:
    acc = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)]
    )
    assert AcceleratorState().mixed_precision == "fp16"
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    data = RegressionData(8)
    before = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    with acc.autocast():
        loss = loss_of(model, {"x": data.x, "y": data.y}) * float("inf")
    acc.backward(loss)
    opt.step()
    sched.step()
    opt.zero_grad()
    assert acc.optimizer_step_was_skipped
    assert sched.get_last_lr() == [0.1]  # the scheduler did not step either
    for k, v in acc.get_state_dict(model).items():
        assert torch.equal(v, before[k])
    assert acc.precision.scaler.get_scale() == 512.0
    # a clean step then runs, and the scheduler steps with it
    acc.backward(loss_of(model, {"x": data.x, "y": data.y}))
    norm = acc.clip_grad_norm_(model.parameters(), 1.0)
    assert norm is not None and torch.isfinite(norm)
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped
    assert sched.get_last_lr() == [0.05]


def test_clip_grad_norm_unscales_once_and_clips() -> None:
    acc = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256.0)]
    )
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    data = RegressionData(8)
    acc.backward(loss_of(model, {"x": data.x, "y": data.y}))
    norm = acc.clip_grad_norm_(model.parameters(), 0.01)
    assert 0.01 < norm.item() < 1e3  # the unscaled norm, not 256 times it
    acc.clip_grad_norm_(model.parameters(), 0.01)  # a second clip must not unscale again
    total = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert total.item() == pytest.approx(0.01, rel=1e-3)


def test_a_plain_step_is_the_optimizers_own_and_an_engine_that_owns_a_part_keeps_it() -> None:
    """A single-process float32 step calls the loss's backward and the optimizer's step and
    zero_grad directly (decided once); a strategy that overrides any of them, or clips, still
    runs its own, whether its class or the object itself overrides it."""
    from accel_parallel import ProcessInfo, SingleDeviceStrategy

    calls: list[str] = []

    class OwnsTheStep(SingleDeviceStrategy):
        def backward(self, loss, backward_fn, **kwargs):
            calls.append("backward")
            super().backward(loss, backward_fn, **kwargs)

        def optimizer_step(self, optimizer, precision):
            calls.append("step")
            return super().optimizer_step(optimizer, precision)

    def run(acc: Accelerator) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = make_model()
        model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        data = RegressionData(8)
        for _ in range(2):
            acc.backward(loss_of(model, {"x": data.x, "y": data.y}))
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    plain = run(Accelerator(cpu=True))
    info = ProcessInfo(torch.device("cpu"))
    owned = run(Accelerator(cpu=True, strategy=OwnsTheStep(info)))
    assert all(map(torch.equal, owned, plain))  # the same operations, in the same order
    assert calls == ["backward", "step"] * 2
    calls.clear()
    patched = SingleDeviceStrategy(info)
    patched.zero_grad = lambda optimizer, set_to_none=True: calls.append("zero_grad")
    run(Accelerator(cpu=True, strategy=patched))
    assert calls == ["zero_grad"] * 2
    clipping = SingleDeviceStrategy(info, clip_norm=1e-3)
    clipped = run(Accelerator(cpu=True, strategy=clipping))
    assert not any(map(torch.equal, clipped, plain))  # clipped to a 1e-3 norm: smaller steps


def test_bf16_autocast_and_unwrap_keeps_or_drops_the_fp32_wrapper() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = acc.prepare(nn.Linear(4, 4))
    out = model(torch.randn(2, 4))
    assert out.dtype == torch.float32  # outputs converted back to fp32
    with acc.autocast():
        assert (torch.randn(2, 4) @ torch.randn(4, 4)).dtype == torch.bfloat16
    inner = acc.unwrap_model(model, keep_fp32_wrapper=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert inner(torch.randn(2, 4)).dtype == torch.bfloat16


def test_bf16_true_casts_weights() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16-true")
    model = acc.prepare(make_model())
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_launch_configuration_is_used_and_code_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "ACCEL_LAUNCH_CONFIG",
        json.dumps({"mixed_precision": "bf16", "gradient_accumulation_steps": 3, "cpu": True}),
    )
    acc = Accelerator()
    assert acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 3
    with pytest.warns(UserWarning, match="mixed_precision='no'.*'bf16'"):
        acc2 = Accelerator(mixed_precision="no")
    assert acc2.mixed_precision == "no"


def test_kwargs_handlers_are_checked() -> None:
    with pytest.raises(ValueError, match="two ddp handlers"):
        Accelerator(
            cpu=True,
            kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()],
        )
    with pytest.raises(TypeError, match="accepted types"):
        Accelerator(cpu=True, kwargs_handlers=[object()])
    with pytest.raises(ValueError, match="comm_hook='nope'"):
        DistributedDataParallelKwargs(comm_hook="nope")


def test_save_get_state_dict_and_free_memory(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(make_model())
    state = acc.get_state_dict(model)
    acc.save(state, tmp_path / "w.safetensors", safe_serialization=True)
    acc.save(state, tmp_path / "w.pt")
    from safetensors.torch import load_file

    for k, v in load_file(tmp_path / "w.safetensors").items():
        assert torch.equal(v, state[k])
    assert torch.load(tmp_path / "w.pt", weights_only=True).keys() == state.keys()
    assert acc.free_memory(model) == [None]
    assert acc._models == []


def test_find_executable_batch_size_retries_smaller() -> None:
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, scale: int) -> int:
        tried.append(batch_size)
        if batch_size > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")
        return batch_size * scale

    with pytest.warns(UserWarning, match="retrying with"):
        assert train(2) == tried[-1] * 2
    assert tried[0] == 64 and all(b <= 40 for b in tried[-1:])

    @find_executable_batch_size(starting_batch_size=4, minimum_batch_size=2)
    def never(batch_size: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory.")

    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="No executable batch size"):
        never()


def test_trackers_log_on_the_main_process(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, log_with="jsonl", project_dir=tmp_path)
    acc.init_trackers("run", config={"lr": 0.1})
    acc.log({"loss": 1.5}, step=1)
    acc.log({"loss": 0.5}, step=2)
    tracker = acc.get_tracker("jsonl")
    acc.end_training()
    from accel_tracking import read_jsonl

    files = list(tmp_path.rglob("*.jsonl"))
    assert files, "the JSONL tracker wrote nothing"
    rows = read_jsonl(files[0])
    assert [(r["step"], r["values"]["loss"]) for r in rows] == [(1, 1.5), (2, 0.5)]
    assert tracker.name == "jsonl"
    with pytest.raises(ValueError, match="Unknown|not known|unknown"):
        Accelerator(cpu=True, log_with="no-such-tracker")


def test_profile_writes_a_trace(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    with acc.profile(ProfileKwargs(output_trace_dir=str(tmp_path), record_shapes=True)) as prof:
        torch.randn(16, 16) @ torch.randn(16, 16)
    assert (tmp_path / "trace_rank0.json").exists()
    assert "aten::mm" in prof.key_averages().table()


def test_process_control_on_one_process() -> None:
    acc = Accelerator(cpu=True)
    with acc.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    assert acc.on_main_process(lambda: 5)() == 5
    with acc.main_process_first():
        pass
    acc.wait_for_everyone()
    assert acc.gather(torch.tensor([1])).tolist() == [1]
    assert acc.reduce(torch.tensor([2.0])).tolist() == [2.0]
    assert not acc.check_trigger()
    acc.set_trigger()
    assert acc.check_trigger()


def _debug_target(out_dir: str) -> None:
    import torch.distributed as dist

    acc = Accelerator()
    t = torch.tensor([float(acc.process_index + 1)])
    dist.all_reduce(t)
    Path(out_dir, f"{acc.process_index}.txt").write_text(
        f"{acc.num_processes} {t.item()} {acc.device}"
    )


def test_debug_launcher_runs_processes(tmp_path: Path) -> None:
    accel.debug_launcher(_debug_target, args=(str(tmp_path),), num_processes=2)
    assert sorted(p.read_text() for p in tmp_path.glob("*.txt")) == ["2 3.0 cpu"] * 2


def test_familiar_module_paths() -> None:
    from accel.big_modeling import init_empty_weights, load_checkpoint_and_dispatch  # noqa: F401
    from accel.data_loader import DataLoaderShard, prepare_data_loader  # noqa: F401
    from accel.hooks import AlignDevicesHook, add_hook_to_module  # noqa: F401
    from accel.launchers import debug_launcher, notebook_launcher  # noqa: F401
    from accel.logging import get_logger
    from accel.state import AcceleratorState, GradientState, PartialState  # noqa: F401
    from accel.tracking import GeneralTracker  # noqa: F401
    from accel.utils import (  # noqa: F401
        DataLoaderConfiguration,
        DistributedType,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProjectConfiguration,
        broadcast_object_list,
        gather_object,
        send_to_device,
        set_seed,
    )

    get_logger(__name__).info("hello", main_process_only=True)


def test_deepspeed_comes_from_the_launch_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    launched = {"distributed_type": "DEEPSPEED", "cpu": True, "deepspeed_config": {"zero_stage": 3}}
    monkeypatch.setenv("ACCEL_LAUNCH_CONFIG", json.dumps(launched))
    acc = Accelerator()
    assert acc.strategy.name == "deepspeed" and acc.deepspeed_plugin.zero_stage == 3
    monkeypatch.delenv("ACCEL_LAUNCH_CONFIG")
    AcceleratorState._reset_state()
    with pytest.raises(TypeError, match="must be a DeepSpeedPlugin"):
        Accelerator(cpu=True, deepspeed_plugin=object())


def test_launch_defaults_do_not_warn(
    monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    launched = {
        "gradient_accumulation_steps": 1,
        "mixed_precision": "no",
        "cpu": True,
        "explicit": ["cpu"],
    }
    monkeypatch.setenv("ACCEL_LAUNCH_CONFIG", json.dumps(launched))
    acc = Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16")
    assert acc.gradient_accumulation_steps == 2 and acc.mixed_precision == "bf16"
    assert not [w for w in recwarn if "accel launch" in str(w.message)]


class _Blocks(nn.Module):
    """Two repeated blocks in an nn.ModuleList, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def test_dynamo_backend_compiles_the_prepared_model() -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    acc = Accelerator(cpu=True, dynamo_backend="eager")
    model = make_model()
    keys = set(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled, opt = acc.prepare(model, opt)
    assert isinstance(compiled, OptimizedModule) and compiled._orig_mod is model
    batch = {"x": torch.randn(4, 4), "y": torch.randn(4, 1)}
    acc.backward(loss_of(compiled, batch))
    opt.step()
    assert set(acc.get_state_dict(compiled)) == keys  # checkpoints keep the plain keys
    assert acc.unwrap_model(compiled, keep_torch_compile=False) is model
    plain = Accelerator(cpu=True, dynamo_backend="no").prepare(make_model())
    assert not isinstance(plain, OptimizedModule)


def test_regional_compilation_compiles_repeated_blocks_in_place() -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    plugin = accel.utils.TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    acc = Accelerator(cpu=True, dynamo_plugin=plugin)
    model = _Blocks()
    out = acc.prepare(model)
    assert out is model and not isinstance(out, OptimizedModule)
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert model.head._compiled_call_impl is None
    assert out(torch.randn(2, 4)).shape == (2, 1)


def test_dynamo_settings_from_accel_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    section = {
        "dynamo_backend": "AOT_EAGER",
        "dynamo_mode": "default",
        "dynamo_use_fullgraph": True,
        "dynamo_use_dynamic": False,
    }
    monkeypatch.setenv("ACCEL_LAUNCH_CONFIG", json.dumps({"cpu": True, "dynamo_config": section}))
    acc = Accelerator()
    assert acc.dynamo_plugin == accel.TorchDynamoPlugin(
        backend="aot_eager", mode="default", fullgraph=True, dynamic=False
    )
    assert isinstance(acc.prepare(make_model()), OptimizedModule)
    with pytest.warns(UserWarning, match="dynamo_backend='no'.*'aot_eager'"):
        assert Accelerator(dynamo_backend="no").dynamo_plugin.backend == "no"


def test_dynamo_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="not a torch.compile backend.*inductor"):
        Accelerator(cpu=True, dynamo_backend="nvprims_nvfuser")
    with pytest.raises(ValueError, match="not both"):
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=accel.TorchDynamoPlugin())


def test_fp8_settings_from_accel_launch_reach_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel_precision

    seen = {}

    def fake_make_precision(mode, **kwargs):
        seen.update(kwargs, mode=mode)
        raise RuntimeError("stop here")

    # the Accelerator imports make_precision when it is made
    monkeypatch.setattr(accel_precision, "make_precision", fake_make_precision)
    fp8 = {"backend": "te", "margin": 3, "fp8_format": "E4M3", "amax_history_length": 8}
    launched = {"cpu": True, "mixed_precision": "fp8", "fp8_config": fp8}
    monkeypatch.setenv("ACCEL_LAUNCH_CONFIG", json.dumps(launched))
    with pytest.raises(RuntimeError, match="stop here"):
        Accelerator()
    kw = seen["fp8_kwargs"]
    assert seen["mode"] == "fp8" and kw.fp8_backend == "te"
    assert (kw.te.margin, kw.te.fp8_format, kw.te.amax_history_len) == (3, "E4M3", 8)


def test_prepared_objects_are_marked_and_sync_gradients_can_be_set() -> None:
    acc = Accelerator(cpu=True)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    loader = DataLoader(RegressionData(8), batch_size=4)
    *prepared, other = acc.prepare(model, opt, sched, loader, [1, 2])
    assert all(getattr(p, "_is_accelerate_prepared", False) is True for p in prepared)
    assert not hasattr(other, "_is_accelerate_prepared")
    acc.sync_gradients = False
    assert accel.GradientState().sync_gradients is False
    acc.sync_gradients = True


def test_a_model_loaded_in_8bit_with_offload_is_refused() -> None:
    from accel.utils import is_bitsandbytes_multi_backend_available

    acc = Accelerator(cpu=True)
    model = make_model()
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cpu"}
    if is_bitsandbytes_multi_backend_available():  # a bitsandbytes that runs on the CPU
        acc.prepare_model(model)  # accelerate's rule: CPU placement trains there
    else:
        with pytest.raises(ValueError, match="CPU or disk offload"):
            acc.prepare_model(model)
    # the backend check is read at the familiar path: patching it there holds (accelerate's
    # own test does this)
    model = make_model()
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cpu"}
    no_cpu_backend = mock.patch(
        "accel.accelerator.is_bitsandbytes_multi_backend_available", lambda: False
    )
    with no_cpu_backend, pytest.raises(ValueError, match="CPU or disk offload"):
        acc.prepare_model(model)
    model = make_model()
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"a": "cpu", "b": "disk"}
    with pytest.raises(ValueError, match="CPU or disk offload"):
        acc.prepare(model)


def test_dynamo_plugin_reads_accelerates_variables_for_unset_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "AOT_EAGER")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    plugin = accel.TorchDynamoPlugin()
    assert plugin.backend == "aot_eager" and plugin.use_regional_compilation is True
    assert plugin.to_kwargs() == {"backend": "aot_eager", "mode": "reduce-overhead"}
    assert accel.TorchDynamoPlugin(backend="eager", mode="default").to_kwargs() == {
        "backend": "eager"
    }  # the code's values win over the variables
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND")
    assert accel.TorchDynamoPlugin().to_kwargs() == {"mode": "reduce-overhead"}


def test_a_step_marked_overflowed_is_not_counted_by_the_scheduler() -> None:
    acc = Accelerator(cpu=True)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1 - n / 10)
    model, opt, sched = acc.prepare(model, opt, sched)
    opt._is_overflow = False  # accelerate's name for step_was_skipped
    sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(0.9)
    opt._is_overflow = True
    assert opt.step_was_skipped is True
    sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(0.9)  # the skipped step is not counted
