"""Worker code for the checkpoint interchange tests: the same loop under accel and accelerate.

Each engine ("single", "ddp", "fsdp_sharded", "fsdp_full", "deepspeed_zero2",
"deepspeed_zero3") trains a small model with dropout (so the resumed steps depend on the
restored RNG), AdamW and a StepLR. Three runs per
direction: the uninterrupted 5 steps of the library that resumes, 3 steps saved by the other
library, and the resume of that save for 2 more steps by the first library.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from accel_testkit.extensions import torch_extensions_dir

BEFORE, AFTER = 3, 2


class Seen:
    """A registered object (custom_checkpoint_0.pkl)."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.3), nn.Linear(16, 16), nn.Linear(16, 1))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)


def _fsdp_plugin(lib: str, engine: str) -> Any:
    kind = "SHARDED_STATE_DICT" if engine == "fsdp_sharded" else "FULL_STATE_DICT"
    if lib == "accel":
        from accel import FullyShardedDataParallelPlugin

        return FullyShardedDataParallelPlugin(state_dict_type=kind)
    from accelerate import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=kind)


def _deepspeed_accelerator(lib: str, engine: str) -> Any:
    """ZeRO-2 or ZeRO-3 from the same config in both libraries (the batch size is written:
    the loop draws its own batches, no DataLoader is prepared)."""
    # DeepSpeed's CPU ops compile once per machine, into the cache test_deepspeed.py uses
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir())
    config = {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0, "zero_optimization": {"stage": int(engine[-1])},
    }  # fmt: skip
    if lib == "accel":
        from accel import Accelerator, DeepSpeedPlugin
        from accel.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=False)
        return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    # accelerate runs DeepSpeed only on accelerators: without one its process state finds no
    # backend and counts one process (every process would write random_states_0.pkl and step
    # the scheduler once a step). Its process state is made as for a CPU run (gloo, the real
    # number of processes), then DeepSpeed is selected as `accelerate launch --use_deepspeed`
    # selects it, and its DeepSpeed code runs as on GPUs, on DeepSpeed's CPU accelerator.
    partial = PartialState(cpu=True)
    partial.distributed_type = _CPU_TYPE.setdefault("type", partial.distributed_type)
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]


def _accelerator(lib: str, engine: str) -> Any:
    if engine.startswith("deepspeed"):
        return _deepspeed_accelerator(lib, engine)
    fsdp = _fsdp_plugin(lib, engine) if engine.startswith("fsdp") else None
    if lib == "accel":
        from accel import Accelerator

        return Accelerator(cpu=True, fsdp_plugin=fsdp)
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DistributedType

    AcceleratorState._reset_state()
    GradientState._reset_state()
    partial = PartialState(cpu=True)
    partial.distributed_type = _CPU_TYPE.setdefault("type", partial.distributed_type)
    acc = Accelerator(cpu=True, fsdp_plugin=fsdp)
    if fsdp is not None:  # accelerate runs FSDP only on accelerators; its code runs on gloo
        partial.distributed_type = acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = fsdp
    return acc


_CPU_TYPE: dict[str, Any] = {}


def _run(lib: str, engine: str, steps: range, save: str | None, load: str | None) -> dict:
    """Train on `steps` (after loading `load`); save into `save` after the first 3 steps."""
    acc = _accelerator(lib, engine)
    seen = Seen()
    acc.register_for_checkpointing(seen)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    if load is not None:
        acc.load_state(load)
    model.train()
    out = {}
    for step in steps:
        x, y = _batch(step, acc.process_index)
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        seen.steps += 1
        if save is not None and step == BEFORE - 1:
            acc.save_state(save)  # saving changes nothing: the run goes on uninterrupted
            out["saved"] = _weights(model)
    if engine.startswith("deepspeed"):
        return {**out, **_deepspeed_snapshot(acc, model, sched, seen)}
    return {**out, **_snapshot(acc, model, opt, sched, seen)}


def _inner(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights, on every process (no RNG is drawn)."""
    if type(model).__name__ == "DeepSpeedEngine":
        from deepspeed.utils import safe_get_full_fp32_param

        return {n: safe_get_full_fp32_param(p).clone() for n, p in model.module.named_parameters()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True)
    return {k: v.clone() for k, v in get_model_state_dict(_inner(model), options=options).items()}


def _snapshot(acc: Any, model: nn.Module, opt: Any, sched: Any, seen: Seen) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    inner = _inner(model)
    optim = get_optimizer_state_dict(
        inner, opt.optimizer, options=StateDictOptions(full_state_dict=True)
    )
    return {
        "weights": _weights(model),
        "optimizer": {n: {k: v.clone() for k, v in s.items()} for n, s in optim["state"].items()},
        "scheduler": sched.scheduler.state_dict()
        if hasattr(sched, "scheduler")
        else sched.state_dict(),
        "seen": seen.steps,
        "rng": torch.rand(3),  # the torch RNG after the run: restored and advanced alike
        "step": acc.step,
    }


def _deepspeed_snapshot(acc: Any, engine: Any, sched: Any, seen: Seen) -> dict:
    """`_snapshot` for a DeepSpeed engine: the fp32 master weights and AdamW state of every
    parameter, gathered from the ZeRO partitions on every process."""
    from deepspeed.utils import safe_get_full_optimizer_state

    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    [step] = {float(s["step"]) for s in base.state.values()}
    optimizer = {
        n: {
            "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").clone(),
            "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").clone(),
            "step": torch.tensor(step),
        }
        for n, p in engine.module.named_parameters()
    }
    inner = sched.scheduler if hasattr(sched, "scheduler") else sched
    return {"weights": _weights(engine), "optimizer": optimizer, "scheduler": inner.state_dict(),
            "seen": seen.steps, "rng": torch.rand(3), "step": acc.step}  # fmt: skip


def interchange(folder: str, engines: list[str]) -> dict:
    """Per engine: each library's uninterrupted 5 steps (saving after 3 on the way), and each
    library's resume of the other's save for the last 2 steps."""
    out: dict[str, Any] = {}
    for engine in engines:
        whole, files = {}, {}
        for lib in ("accelerate", "accel"):
            ckpt = os.path.join(folder, f"{engine}_{lib}")
            whole[lib] = _run(lib, engine, range(BEFORE + AFTER), ckpt, None)
            files[lib] = sorted(os.listdir(ckpt))
        for saver, loader in (("accelerate", "accel"), ("accel", "accelerate")):
            ckpt = os.path.join(folder, f"{engine}_{saver}")
            resumed = _run(loader, engine, range(BEFORE, BEFORE + AFTER), None, ckpt)
            out[f"{engine}: {saver} saves, {loader} resumes"] = {
                "whole": whole[loader], "resumed": resumed, "files": files[saver],
                "saved": whole[saver]["saved"],  # the saver's weights after 3 steps
            }  # fmt: skip
    return out


class _Broken:
    """A registered object whose state cannot be read: the save fails half-way."""

    def state_dict(self) -> dict:
        raise RuntimeError("state_dict failed")

    def load_state_dict(self, state: dict) -> None:  # pragma: no cover - never loaded
        raise AssertionError


def interrupted_save(project: str) -> dict:
    """accel saves checkpoint_0, then fails in the middle of checkpoint_1; both libraries'
    automatic load_state() then resume checkpoint_0."""
    from accelerate.utils import ProjectConfiguration as AccelerateProject

    from accel import ProjectConfiguration

    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    acc = _accelerator("accel", "single")
    acc.project_configuration = config
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    acc.save_state()
    saved = _weights(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.register_for_checkpointing(_Broken())
    try:
        acc.save_state()
    except RuntimeError as err:
        failed = str(err)
    out: dict[str, Any] = {"failed": failed, "listing": sorted(os.listdir(project))}
    for lib in ("accelerate", "accel"):
        other = _accelerator(lib, "single")
        if lib == "accelerate":
            other.project_configuration = AccelerateProject(
                project_dir=project, automatic_checkpoint_naming=True
            )
        else:
            other.project_configuration = ProjectConfiguration(
                project_dir=project, automatic_checkpoint_naming=True
            )
        fresh = _model()
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        fresh, _ = other.prepare(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.05))
        other.load_state()
        out[lib] = all(torch.equal(v, saved[k]) for k, v in _weights(fresh).items())
    return out
