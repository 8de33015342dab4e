"""Behaviours an accelerate script relies on, beyond the names existing."""

from __future__ import annotations

import types

import pytest
import torch

from accel import Accelerator, AcceleratorState, AutocastKwargs


@pytest.fixture(autouse=True)
def _fresh_state():
    yield
    AcceleratorState._reset_state()


def test_autocast_handler_applies_to_its_block() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    a = torch.randn(4, 4)
    with acc.autocast():
        assert (a @ a).dtype == torch.bfloat16
    with acc.autocast(autocast_handler=AutocastKwargs(enabled=False)):
        assert (a @ a).dtype == torch.float32
    with acc.autocast():
        assert (a @ a).dtype == torch.bfloat16


def test_accelerator_state_reads_what_the_accelerator_chose() -> None:
    Accelerator(cpu=True, mixed_precision="bf16")
    state = AcceleratorState()
    assert state.mixed_precision == "bf16"
    assert state.num_processes == 1


def test_familiar_accelerator_attributes() -> None:
    from accel import (
        Accelerator,
        AcceleratorState,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        ProjectConfiguration,
    )

    AcceleratorState._reset_state()
    ddp, scaler = DistributedDataParallelKwargs(bucket_cap_mb=5), GradScalerKwargs(init_scale=8.0)
    acc = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[ddp, scaler],
        project_config=ProjectConfiguration(iteration=3),
    )  # fmt: skip
    assert acc.ddp_handler is ddp and acc.scaler_handler is scaler
    assert acc.init_handler is None and acc.autocast_handler is None
    assert acc.scaler is acc.precision.scaler and acc.scaler.get_scale() == 8.0
    assert acc.native_amp and acc.save_iteration == 3 and acc.use_stateful_dataloader is False
    AcceleratorState._reset_state()
    plain = Accelerator(cpu=True)
    assert plain.scaler is None and not plain.native_amp


def _draws_after_epoch_start(rng_types: list[str] | None) -> float:
    from torch.utils.data import DataLoader

    from accel import Accelerator

    acc = Accelerator(cpu=True, rng_types=rng_types)
    torch.manual_seed(100 + acc.process_index)  # every process starts from its own state
    loader = acc.prepare(DataLoader(list(range(8)), batch_size=2))
    for _ in loader:
        return torch.rand(1).item()
    raise AssertionError("empty loader")


def _both(rng_types: list[str] | None) -> dict:
    from accel import AcceleratorState

    synced = _draws_after_epoch_start(rng_types)
    AcceleratorState._reset_state()
    return {"synced": synced}


def test_rng_types_synchronize_the_named_generators_at_each_epoch_start():
    from accel_state.testing import run_distributed

    synced = run_distributed(_both, ["torch"], world_size=2)
    assert synced[0]["synced"] == synced[1]["synced"]  # rank 0's torch state everywhere
    alone = run_distributed(_both, None, world_size=2)  # the default: loaders' generators only
    assert alone[0]["synced"] != alone[1]["synced"]
    from accel import Accelerator, AcceleratorState

    AcceleratorState._reset_state()
    with pytest.raises(ValueError, match="does not synchronize XLA's generator"):
        Accelerator(cpu=True, rng_types=["xla"])


def test_compile_regions_returns_a_twin_with_each_repeated_block_compiled() -> None:
    from torch import nn

    from accel.utils import compile_regions, has_compiled_regions

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    model, x = Stack(), torch.randn(2, 4)
    expected, keys = model(x), list(model.state_dict())
    assert not has_compiled_regions(model)
    model.forward = types.MethodType(type(model).forward, model)  # bound to the original
    twin = compile_regions(model, backend="eager")
    assert twin is not model and not has_compiled_regions(model)  # the original is untouched
    assert has_compiled_regions(twin) and type(twin.blocks[0]).__name__ == "OptimizedModule"
    assert twin.__dict__["forward"].__self__ is twin and twin._orig_mod is model
    assert twin.blocks[0]._orig_mod.weight is model.blocks[0].weight  # the same parameters
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(twin(x), expected)


def test_gradient_state_is_one_shared_state_that_libraries_read() -> None:
    from torch import nn
    from torch.utils.data import DataLoader

    from accel import GradientState
    from accel.utils import GradientAccumulationPlugin

    GradientState._reset_state()
    assert GradientState().num_steps == 1 and GradientState().sync_gradients
    acc = Accelerator(cpu=True, gradient_accumulation_steps=3)
    reader = GradientState()  # what a library or a callback creates on its own
    assert reader.num_steps == 3 and reader.plugin_kwargs == {"num_steps": 3}  # non-defaults
    Accelerator(
        cpu=True,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=True),
    )
    assert GradientState().plugin_kwargs == {"num_steps": 2, "sync_each_batch": True}
    acc = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(7, 2), batch_size=1)
    model, opt, loader = acc.prepare(model, opt, loader)
    syncs, steps, ends = [], [], []
    for x in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            syncs.append(reader.sync_gradients)
            steps.append(acc.step)
            ends.append(reader.end_of_dataloader)
    # 7 batches, 3 per step: sync after the 3rd, the 6th, and the last (end of the loader)
    assert syncs == [False, False, True, False, False, True, True]
    assert steps == [1, 2, 3, 4, 5, 6, 0]  # accelerate's count: reset at the loader's end
    assert ends == [False] * 6 + [True]
    assert not reader.in_dataloader


def test_a_failed_flush_fails_the_save_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch
) -> None:
    import errno
    import os

    from torch import nn

    acc = Accelerator(cpu=True)
    model = acc.prepare(nn.Linear(3, 3))
    first = acc.save_state(tmp_path / "ck")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        acc.save_state(tmp_path / "ck")
    monkeypatch.undo()
    acc.load_state(first)  # the previous checkpoint is whole and still the one in place
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k])


def _stateful_run(project, stop: int | None) -> list[int]:
    from torch import nn
    from torch.utils.data import DataLoader

    from accel import DataLoaderConfiguration

    AcceleratorState._reset_state()
    acc = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    data = torch.arange(24, dtype=torch.float32).unsqueeze(1)
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    loader = DataLoader(data, batch_size=2, shuffle=True, num_workers=2)
    model, loader = acc.prepare(model, loader)
    if stop is None and (project / "ck").exists():
        acc.load_state(project / "ck")
    seen = []
    for k, batch in enumerate(loader):
        seen += batch.flatten().int().tolist()
        if k == stop:
            state = loader.state_dict()
            # torchdata's own state (2 workers: its snapshot layout) as of the last batch seen
            assert state["_snapshot"]["_snapshot_step"] == stop + 1
            acc.save_state(project / "ck")
            break
    return seen


def test_stateful_dataloader_resumes_exactly_with_workers(tmp_path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    full = _stateful_run(tmp_path / "full", None)
    head = _stateful_run(tmp_path, 4)
    tail = _stateful_run(tmp_path, None)
    assert head + tail == full and sorted(full) == list(range(24))
    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True, dataloader_config=__import__("accel").DataLoaderConfiguration(
        use_stateful_dataloader=True))  # fmt: skip
    prepared = acc.prepare(torch.utils.data.DataLoader(list(range(4)), batch_size=2))
    assert isinstance(prepared.base_dataloader, StatefulDataLoader)


def test_load_config_from_file_reads_what_accel_config_wrote(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from accel.commands.config import default_config_file, load_config_from_file

    assert default_config_file.endswith("default_config.yaml")
    path = tmp_path / "cfg.yaml"
    accel_cli = Path(sys.executable).with_name("accel")
    subprocess.run(
        [str(accel_cli), "config", "default", "--config_file", str(path)],
        check=True, capture_output=True,
    )  # fmt: skip
    config = load_config_from_file(str(path))
    assert config.to_dict()["distributed_type"] == config.distributed_type
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config_from_file(str(tmp_path / "missing.yaml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    with pytest.raises(FileNotFoundError, match="no default configuration file"):
        load_config_from_file()


def test_distributed_type_names_the_engine_as_accelerate_does() -> None:
    from accel import DistributedType
    from accel_parallel import (
        DeepSpeedPlugin,
        FullyShardedDataParallelPlugin,
        ProcessInfo,
        resolve_strategy,
    )

    acc = Accelerator(cpu=True)
    assert acc.distributed_type == AcceleratorState().distributed_type == DistributedType.NO
    info = ProcessInfo(torch.device("cpu"))
    for plugins, expected in (
        ({"deepspeed_plugin": DeepSpeedPlugin()}, "DEEPSPEED"),
        ({"fsdp_plugin": FullyShardedDataParallelPlugin()}, "FSDP"),
        ({}, "NO"),
    ):
        AcceleratorState._record(strategy=resolve_strategy(info, **plugins).strategy)
        assert AcceleratorState().distributed_type == DistributedType(expected)


def test_backward_with_scale_wrt_gas_false_leaves_the_loss_undivided() -> None:
    from torch import nn

    grads = {}
    for scale in (True, False):
        AcceleratorState._reset_state()
        acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
        torch.manual_seed(0)
        model = acc.prepare(nn.Linear(2, 1))
        acc.backward(model(torch.ones(1, 2)).sum(), scale_wrt_gas=scale)
        grads[scale] = model.weight.grad.clone()
    torch.testing.assert_close(grads[False], 4 * grads[True])
