"""DeepSpeed ZeRO through the Accelerator, for real: gloo workers on CPU, compared with one
process of plain PyTorch.

Few launches (each costs seconds): one 2-process launch trains every variant in turn and
saves a checkpoint in the middle of one; a second 2-process launch resumes it. The CPU-Adam
offload launch compiles DeepSpeed's extension once per machine (cached under
TORCH_EXTENSIONS_DIR) and is marked slow. Every worker first makes `import transformers`
fail, so the whole module proves that DeepSpeed through accel needs no transformers.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from accel_state.testing import run_distributed
from accel_testkit.extensions import torch_extensions_dir
from accel_testkit.launch import LAUNCHER_VARS, accel_command, worker_env
from accel_testkit.tolerance import assert_same_training, float32_error, norm_terms

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install accel-parallel[deepspeed])",
)

SAMPLES, GLOBAL_BATCH, STEPS, LR, CLIP = 64, 16, 4, 1e-2, 0.05
AUTO_CLIP = 1.0  # what gradient_clipping "auto" (a plain DeepSpeedPlugin) clips at
# AdamW stays (DeepSpeed's universal checkpoint and its "optimizer" section know Adam only),
# with an eps above every gradient element (the gradients are clipped to norm <= 1): its step
# lr * m / (sqrt(v) + eps) is then within a factor 2 of lr * m and changes by at most
# 2 * lr * d for a change d in the gradients, like SGD's, instead of amplifying the rounding
# of a near-zero gradient to a step of +-lr (eps=1e-8). See accel_testkit.tolerance.
ADAM_EPS = 1.0
EXTENSIONS = torch_extensions_dir()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.hidden = nn.Linear(16, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def make_optimizer(params: Any, lr: float = LR) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, eps=ADAM_EPS)


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def reference(
    steps: int = STEPS,
    clip: float | None = None,
    lrs: list[float] | None = None,
    teacher: bool = False,
) -> dict[str, Any]:
    """One process, plain PyTorch, the whole global batch each step."""
    model = make_net()
    target = _teacher() if teacher else None
    opt = make_optimizer(model.parameters())
    loader = torch.utils.data.DataLoader(dataset(), batch_size=GLOBAL_BATCH)
    norms = []
    for step, (x, y) in zip(range(steps), loader):
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[step]
        y = target(x) if target is not None else y
        nn.functional.mse_loss(model(x), y).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        opt.zero_grad()
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "norms": norms}


def _teacher() -> nn.Module:
    torch.manual_seed(7)
    teacher = Net()
    return teacher.requires_grad_(False)


# -- in the workers ------------------------------------------------------------------------------
def _worker_setup() -> None:
    """No transformers in this process, DeepSpeed's extensions in the per-machine cache.
    mlflow, which DeepSpeed's autotuner imports when it is installed and never uses here, is
    kept out too: importing it costs each worker seconds."""
    sys.modules["transformers"] = None  # type: ignore[assignment]  # `import transformers` fails
    sys.modules["mlflow"] = None  # type: ignore[assignment]
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", EXTENSIONS)


def _accelerator(plugin: Any, **kwargs: Any) -> Any:
    from accel import Accelerator
    from accel.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(deepspeed_plugin=plugin, **kwargs)


def _train(acc: Any, model: Any, opt: Any, loader: Any, steps: int, clip: float | None = None,
           sched: Any = None, teacher: Any = None, save_at: tuple[int, str] | None = None,
           ) -> dict[str, Any]:  # fmt: skip
    """The familiar loop; returns the clip norms and the lr each optimizer step used."""
    norms, lrs = [], []
    done = 0
    for x, y in loader:
        with acc.accumulate(model):
            if teacher is not None:
                with torch.no_grad():
                    y = teacher(x).float()
            # the loss in float32 (a bf16 engine's output against the fp32 target): torch 2.9's
            # mse_loss has no backward for a bf16 input and an fp32 target, later torch promotes
            acc.backward(nn.functional.mse_loss(model(x).float(), y))
            if clip is not None and acc.sync_gradients:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), clip)))
            if acc.sync_gradients:
                lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            if sched is not None:
                sched.step()
            opt.zero_grad()
        if acc.sync_gradients:
            done += 1
            if save_at is not None and done == save_at[0]:
                acc.save_state(save_at[1])
                lrs.clear()
            if done == steps:
                break
    return {"norms": norms, "lrs": lrs}


def _loader(batch: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(), batch_size=batch)


def _plain(acc: Any, model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in acc.get_state_dict(model).items()}


def _variant(plugin: Any, steps: int = STEPS, batch: int = GLOBAL_BATCH // 2, clip: float | None = None,
             save: str | None = None, **kwargs: Any) -> dict[str, Any]:  # fmt: skip
    acc = _accelerator(plugin, **kwargs)
    with acc.deepspeed_plugin.zero3_init():
        net = make_net()
    model, opt, loader = acc.prepare(net, make_optimizer(net.parameters()), _loader(batch))
    out = _train(acc, model, opt, loader, steps, clip=clip)
    if save is not None:  # resumed on 1 and 4 processes by test_zero_checkpoints_resume_...
        acc.save_state(save)
        out["saved"] = _zero_state(model)
    out.update(state=_plain(acc, model), config=acc.deepspeed_config, mixed=acc.mixed_precision)
    if acc.mixed_precision == "bf16":  # the state dict holds the bf16 weights: the fp32 too
        out["master"] = {k: v["fp32"] for k, v in _zero_state(model)["params"].items()}
    out["unwrapped"] = type(acc.unwrap_model(model)).__name__
    out["engine"] = type(model).__name__
    return out


def _variants(folder: str) -> dict[str, Any]:
    _worker_setup()
    from accel.utils import DeepSpeedPlugin

    results: dict[str, Any] = {}
    results["zero1"] = _variant(DeepSpeedPlugin(zero_stage=1))
    results["zero2"] = _variant(DeepSpeedPlugin(zero_stage=2), save=f"{folder}/{RESHARD[2]}")
    zero3 = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True, zero3_save_16bit_model=True)
    results["zero3"] = _zero3(zero3, folder)
    results["accumulate"] = _variant(
        DeepSpeedPlugin(zero_stage=2), steps=STEPS, batch=GLOBAL_BATCH // 4,
        gradient_accumulation_steps=2,
    )  # fmt: skip
    results["clip2"] = _variant(DeepSpeedPlugin(zero_stage=2), clip=CLIP)
    results["clip3"] = _variant(
        DeepSpeedPlugin(zero_stage=3, zero3_save_16bit_model=True), clip=CLIP
    )
    results["bf16"] = _variant(DeepSpeedPlugin(zero_stage=2), mixed_precision="bf16")
    results["auto"] = _auto()
    results["plugins"] = _two_plugins()
    results["no_16bit"] = _no_16bit_error()
    results["resume"] = _save_midway(folder)
    results["transformers"] = sys.modules.get("transformers") is None
    return results


def _zero3(plugin: Any, folder: str) -> dict[str, Any]:
    acc = _accelerator(plugin)
    with acc.deepspeed_plugin.zero3_init():  # parameters partitioned as they are made
        net = make_net()
    local = sum(p.ds_tensor.numel() for p in net.parameters())
    total = sum(p.ds_numel for p in net.parameters())
    model, opt, loader = acc.prepare(net, make_optimizer(net.parameters()), _loader(8))
    _train(acc, model, opt, loader, STEPS)
    acc.save_model(model, Path(folder) / "export3")
    saved = sorted(os.listdir(Path(folder) / "export3")) if acc.is_main_process else []
    acc.save_state(Path(folder) / RESHARD[3])
    return {"state": _plain(acc, model), "local_numel": local, "total_numel": total,
            "saved": _zero_state(model),
            "saved_files": saved, "engine": type(model).__name__,
            "unwrapped": type(acc.unwrap_model(model)).__name__,
            "config": acc.deepspeed_config}  # fmt: skip


# -- a ZeRO checkpoint of 2 processes, resumed on 1 and on 4 ------------------------------------
RESHARD = {2: "zero2_on_2", 3: "zero3_on_2"}  # the checkpoints _variants saves after STEPS steps


def _zero_state(engine: Any) -> dict[str, Any]:
    """The fp32 master weights and AdamW state of every parameter, gathered from the ZeRO
    partitions (on every process), and the optimizer's step and lr."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    state = {
        name: {"fp32": safe_get_full_fp32_param(p).clone(),
               "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").clone(),
               "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").clone()}
        for name, p in engine.module.named_parameters()
    }  # fmt: skip
    steps = sorted({float(s["step"]) for s in base.state.values()})
    return {"params": state, "steps": steps, "lr": base.param_groups[0]["lr"]}


def _files(folder: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (os.fspath(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
    )


def _reshard(folder: str) -> dict[str, Any]:
    """Each checkpoint of 2 processes loaded here (1 or 4 processes), then one more step on
    the first GLOBAL_BATCH samples, split between the processes."""
    _worker_setup()
    from accel.utils import DeepSpeedPlugin

    x, y = dataset()[:GLOBAL_BATCH]
    out: dict[str, Any] = {}
    for stage, name in RESHARD.items():
        checkpoint = Path(folder) / name
        before = _files(checkpoint)
        acc = _accelerator(DeepSpeedPlugin(zero_stage=stage))
        with acc.deepspeed_plugin.zero3_init():
            net = make_net()
        n = acc.num_processes
        per = GLOBAL_BATCH // n
        model, opt, _ = acc.prepare(net, make_optimizer(net.parameters()), _loader(per))
        acc.load_state(checkpoint)
        loaded = _zero_state(model)
        mine = slice(acc.process_index * per, (acc.process_index + 1) * per)
        acc.backward(nn.functional.mse_loss(model(x[mine]), y[mine]))
        opt.step()
        opt.zero_grad()
        stepped = {k: v["fp32"] for k, v in _zero_state(model)["params"].items()}
        acc.wait_for_everyone()
        unchanged = _files(checkpoint) == before
        out[name] = {"loaded": loaded, "stepped": stepped, "unchanged": unchanged}
    return out


def _one_more_step(saved: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Plain torch AdamW continuing from the saved weights and optimizer state, one step on
    the first GLOBAL_BATCH samples, clipped as a plain DeepSpeedPlugin clips."""
    model = make_net()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(saved["params"][name]["fp32"])
    opt = make_optimizer(model.parameters(), lr=saved["lr"])
    [step] = saved["steps"]
    for name, p in params.items():
        s = saved["params"][name]
        opt.state[p] = {"step": torch.tensor(step), "exp_avg": s["exp_avg"].clone(),
                        "exp_avg_sq": s["exp_avg_sq"].clone()}  # fmt: skip
    x, y = dataset()[:GLOBAL_BATCH]
    nn.functional.mse_loss(model(x), y).backward()
    nn.utils.clip_grad_norm_(model.parameters(), AUTO_CLIP)
    opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _auto() -> dict[str, Any]:
    from accel.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler

    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": "auto", "weight_decay": "auto", "eps": ADAM_EPS, "torch_adam": True},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                       "warmup_type": "linear"},
        },
    }  # fmt: skip
    acc = _accelerator(DeepSpeedPlugin(hf_ds_config=config))
    net = make_net()
    opt = DummyOptim(net.parameters(), lr=LR, weight_decay=0.01)
    sched = DummyScheduler(opt, warmup_num_steps=3)
    model, opt, sched, loader = acc.prepare(net, opt, sched, _loader(GLOBAL_BATCH // 2))
    out = _train(acc, model, opt, loader, STEPS, sched=sched)
    plugin = acc.deepspeed_plugin
    out.update(
        state=_plain(acc, model), config=acc.deepspeed_config, filled=plugin.filled,
        optimizer=type(opt.optimizer).__name__, weight_decay=opt.param_groups[0]["weight_decay"],
    )  # fmt: skip
    return out


def _two_plugins() -> dict[str, Any]:
    """A trained student (ZeRO-2) and a frozen teacher (ZeRO-3), each with its own plugin."""
    from accel import Accelerator
    from accel.state import AcceleratorState
    from accel.utils import DeepSpeedPlugin, get_active_deepspeed_plugin

    AcceleratorState._reset_state(reset_partial_state=False)
    student_plugin = DeepSpeedPlugin(zero_stage=2)
    teacher_plugin = DeepSpeedPlugin(zero_stage=3)
    acc = Accelerator(deepspeed_plugins={"student": student_plugin, "teacher": teacher_plugin})
    first = get_active_deepspeed_plugin(acc.state) is student_plugin
    net = make_net()
    model, opt, loader = acc.prepare(
        net, make_optimizer(net.parameters()), _loader(GLOBAL_BATCH // 2)
    )
    acc.state.select_deepspeed_plugin("teacher")
    teacher = acc.prepare(_teacher())
    then = acc.deepspeed_plugin is teacher_plugin and not student_plugin.selected
    out = _train(acc, model, opt, loader, STEPS, teacher=teacher)
    out.update(state=_plain(acc, model), selected=[first, then],
               teacher_stage=teacher.zero_optimization_stage())  # fmt: skip
    return out


def _no_16bit_error() -> str:
    from accel.utils import DeepSpeedPlugin

    acc = _accelerator(DeepSpeedPlugin(zero_stage=3))
    net = make_net()
    model, _, _ = acc.prepare(net, make_optimizer(net.parameters()), _loader(8))
    try:
        acc.get_state_dict(model)
    except ValueError as err:
        return str(err)
    return "no error"


def _resume_setup(plugin: Any) -> tuple[Any, ...]:
    from accel.utils import ProjectConfiguration

    acc = _accelerator(plugin, project_config=ProjectConfiguration())
    net = make_net()
    opt = make_optimizer(net.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    g = torch.Generator().manual_seed(5)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=4, shuffle=True, generator=g)
    return acc, *acc.prepare(net, opt, sched, loader)


def _save_midway(folder: str) -> dict[str, Any]:
    from accel.utils import DeepSpeedPlugin

    acc, model, opt, sched, loader = _resume_setup(DeepSpeedPlugin(zero_stage=2))
    ckpt = str(Path(folder) / "ckpt")
    rest = _train(acc, model, opt, loader, 5, sched=sched, save_at=(2, ckpt))
    files = sorted(os.listdir(ckpt))
    return {"state": _plain(acc, model), "lrs": rest["lrs"], "files": files}


def _resume_launched(folder: str) -> dict[str, Any]:
    """Under `accel launch --use_deepspeed --zero_stage 2`: the Accelerator gets no plugin."""
    _worker_setup()
    acc, model, opt, sched, loader = _resume_setup(None)
    acc.load_state(Path(folder) / "ckpt")
    rest = _train(acc, model, opt, loader, 3, sched=sched)
    state = _plain(acc, model)
    acc.wait_for_everyone()  # no collective after this: the script may leave with os._exit
    return {"state": state, "lrs": rest["lrs"], "rank": acc.process_index,
            "strategy": acc.strategy.name, "stage": acc.deepspeed_config["zero_optimization"],
            "transformers": sys.modules.get("transformers") is None}  # fmt: skip


RESUME_SCRIPT = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("accel_deepspeed_test", {path!r})
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
out = module._resume_launched(sys.argv[1])
torch.save(out, f"{{sys.argv[1]}}/resumed_{{out['rank']}}.pt")
# torch 2.15 gloo processes that ran DeepSpeed's CPU ops sometimes abort while the interpreter
# tears down ("terminate called without an active exception"): the results are written, so
# leave without the teardown.
sys.stdout.flush(); sys.stderr.flush()
import os; os._exit(0)
"""


def _accel_launch(folder: str, *flags: str) -> None:
    """`accel launch FLAGS script folder` in a clean environment (no user config file)."""
    script = Path(folder) / "resume.py"
    script.write_text(RESUME_SCRIPT.format(path=__file__))
    command = accel_command("launch", *flags, script, folder, entry_point=True)
    env = worker_env(drop=["ACCEL_*", *LAUNCHER_VARS], XDG_CONFIG_HOME=str(Path(folder) / "config"))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _cpu_offload() -> dict[str, Any]:
    _worker_setup()
    from accel.utils import DeepSpeedPlugin

    out = _variant(DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu"))
    out["transformers"] = sys.modules.get("transformers") is None
    return out


# -- the launches --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, Any]:
    folder = str(tmp_path_factory.mktemp("deepspeed"))
    ranks = run_distributed(_variants, folder, world_size=2, timeout=400)
    _accel_launch(folder, "--use_deepspeed", "--zero_stage", "2", "--cpu", "--num_processes", "2")
    again = [torch.load(Path(folder) / f"resumed_{r}.pt", weights_only=False) for r in (0, 1)]
    return {"ranks": ranks, "again": again, "folder": folder}


@pytest.fixture(scope="module")
def resharded(launched) -> dict[int, list[dict[str, Any]]]:
    """The 2-process ZeRO-2 and ZeRO-3 checkpoints of `launched`, loaded on 1 and on 4
    processes; both launches at once, so that the 1-process one does not leave a core idle."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {n: pool.submit(run_distributed, _reshard, launched["folder"], world_size=n,
                               timeout=400) for n in (1, 4)}  # fmt: skip
        return {n: run.result() for n, run in runs.items()}


def _assert_close(state: dict, expected: dict, **tol: float) -> None:
    assert sorted(state) == sorted(expected)
    for k, v in expected.items():
        torch.testing.assert_close(state[k], v, **tol, msg=lambda m, k=k: f"{k}: {m}")


def _step_error(layers: int = 3) -> float:
    """A step's float32 error: Net's 3 linear layers (the teacher's forward adds 3), reductions
    of at most 16 terms, clipped; Adam's factor 2 on top (ADAM_EPS)."""
    return 2 * float32_error(layers, terms=16, norm_terms=norm_terms(make_net().parameters()))


def _same_training(state: dict, expected: dict, steps: int = STEPS, error: float | None = None,
                   start: dict | None = None) -> None:  # fmt: skip
    """`steps` steps from `start` (make_net()'s weights by default) within `error` a step
    (float32 rounding by default) of the expected ones."""
    start = make_net().state_dict() if start is None else start
    error = _step_error() if error is None else error
    assert_same_training(state, expected, start, bound=steps * error)


def test_zero_1_2_3_on_two_processes_equal_one_process_plain_torch(launched):
    """A plain DeepSpeedPlugin clips at 1.0, as accelerate's does ("auto" gradient_clipping);
    step 2's gradient norm (1.3) is above it, so the clipping shows in the weights."""
    expected = reference(clip=AUTO_CLIP)["state"]
    for rank in launched["ranks"]:
        for name in ("zero1", "zero2", "zero3"):
            result = rank[name]
            if name != "zero3" or rank is launched["ranks"][0]:
                _same_training(result["state"], expected)
            assert result["engine"] == "DeepSpeedEngine" and result["unwrapped"] == "Net"
            assert result["config"]["gradient_clipping"] == AUTO_CLIP
    assert launched["ranks"][1]["zero3"]["state"] == {}  # ZeRO-3 gathers on the main process


def test_accumulation_of_two_equals_the_big_batch(launched):
    expected = reference(clip=AUTO_CLIP)["state"]
    result = launched["ranks"][0]["accumulate"]
    assert result["config"]["gradient_accumulation_steps"] == 2
    assert result["config"]["train_micro_batch_size_per_gpu"] == GLOBAL_BATCH // 4
    assert result["config"]["train_batch_size"] == GLOBAL_BATCH
    _same_training(result["state"], expected)


def test_clip_grad_norm_returns_the_global_norm_and_clips_like_torch(launched):
    expected = reference(clip=CLIP)
    assert min(expected["norms"]) > CLIP  # the clipping is active on every step
    for name in ("clip2", "clip3"):
        result = launched["ranks"][0][name]
        assert result["norms"] == pytest.approx(expected["norms"], rel=1e-5)
        assert launched["ranks"][1][name]["norms"] == result["norms"]  # the same on every rank
        _same_training(result["state"], expected["state"])


def test_zero3_init_partitions_and_full_weights_are_gathered(launched):
    expected = reference(clip=AUTO_CLIP)["state"]
    rank0, rank1 = (r["zero3"] for r in launched["ranks"])
    for r in (rank0, rank1):  # zero.Init: each process holds half of every parameter
        assert r["local_numel"] * 2 == pytest.approx(r["total_numel"], abs=16)
    assert rank0["saved_files"] == ["model.safetensors"]
    from safetensors.torch import load_file

    saved = load_file(str(Path(launched["folder"]) / "export3" / "model.safetensors"))
    _same_training(saved, expected)
    message = launched["ranks"][0]["no_16bit"]
    assert "zero3_save_16bit_model=True" in message and "stage3_gather_16bit" in message


def test_auto_values_are_filled_from_the_run_and_reported(launched):
    result = launched["ranks"][0]["auto"]
    config, filled = result["config"], result["filled"]
    assert config["train_micro_batch_size_per_gpu"] == GLOBAL_BATCH // 2
    assert config["train_batch_size"] == GLOBAL_BATCH
    assert config["gradient_accumulation_steps"] == 1
    assert config["gradient_clipping"] == AUTO_CLIP  # "auto": accelerate's 1.0
    assert config["bf16"]["enabled"] is False
    adamw = {"lr": LR, "weight_decay": 0.01, "eps": ADAM_EPS, "torch_adam": True}
    assert config["optimizer"]["params"] == adamw
    params = config["scheduler"]["params"]
    assert params["warmup_max_lr"] == LR and params["warmup_min_lr"] == 0.0
    assert params["warmup_num_steps"] == 3
    assert "DataLoader" in filled["train_micro_batch_size_per_gpu"][1]
    assert "as accelerate does" in filled["gradient_clipping"][1]
    assert result["optimizer"] == "AdamW" and result["weight_decay"] == 0.01
    # the engine built its WarmupLR and stepped it once per optimizer step (DeepSpeed sets
    # lr(iteration 0) when it builds the schedule and again at its first step)
    lrs = result["lrs"]
    assert lrs == pytest.approx([0.0, 0.0, LR / 3, 2 * LR / 3])
    # torch's AdamW (weight_decay 0.01 by default) with the same lr per step: the same weights
    _same_training(result["state"], reference(lrs=lrs, clip=AUTO_CLIP)["state"])


def test_bf16_zero2_trains_close_to_fp32(launched):
    """bf16 weights in forward and backward with fp32 master weights: each of a step's
    2 * 3 + 1 chained results is rounded to bf16's 8 bits (2**-8), so the gradients are within
    7 * 2**-8 of float32's, and the master weights' movement within STEPS times that (Adam's
    factor 2 on top) of the float32 run's. DeepSpeed makes the master weights from the bf16
    model, the initial weights rounded by up to 2**-9 of their size (more than these small
    steps move them): each run's movement is taken from its own start."""
    expected = reference(clip=AUTO_CLIP)["state"]
    result = launched["ranks"][0]["bf16"]
    assert result["mixed"] == "bf16" and result["config"]["bf16"]["enabled"] is True
    start = make_net().state_dict()
    moved = {k: v - start[k].bfloat16().float() + start[k] for k, v in result["master"].items()}
    _same_training(moved, expected, error=2 * (2 * 3 + 1) * 2.0**-8)


def test_several_models_with_their_own_plugins(launched):
    result = launched["ranks"][0]["plugins"]
    assert result["selected"] == [True, True] and result["teacher_stage"] == 3
    # the teacher's forward (3 more layers) makes the targets
    expected = reference(teacher=True, clip=AUTO_CLIP)["state"]
    _same_training(result["state"], expected, error=_step_error(layers=6))


def test_resume_under_accel_launch_equals_the_unbroken_run(launched):
    first = launched["ranks"][0]["resume"]
    # the engine's tag folder as accelerate names it, and accel's marker
    assert "pytorch_model" in first["files"] and "accel_checkpoint.json" in first["files"]
    again = launched["again"][0]
    assert again["strategy"] == "deepspeed" and again["stage"]["stage"] == 2  # from the launch
    _assert_close(again["state"], first["state"], rtol=0.0, atol=0.0)  # bit for bit
    assert again["lrs"] == first["lrs"]


def test_zero_checkpoints_resume_on_another_number_of_processes(launched, resharded):
    """ZeRO-2 and ZeRO-3 checkpoints saved by 2 processes load on 1 and on 4 (DeepSpeed's
    universal checkpoint, converted inside load_state) with the very same fp32 weights, Adam
    moments, step and lr on every process; the next step is plain AdamW's from that state.
    The checkpoint is only read, and its converted copy is gone afterwards."""
    saved = {RESHARD[2]: launched["ranks"][0]["zero2"]["saved"],
             RESHARD[3]: launched["ranks"][0]["zero3"]["saved"]}  # fmt: skip
    assert saved[RESHARD[2]]["steps"] == saved[RESHARD[3]]["steps"] == [float(STEPS)]
    after = {name: _one_more_step(expected) for name, expected in saved.items()}
    start = {name: {k: v["fp32"] for k, v in expected["params"].items()}
             for name, expected in saved.items()}  # fmt: skip
    for n, ranks in resharded.items():
        assert len(ranks) == n
        for rank in ranks:
            for name, expected in saved.items():
                result = rank[name]
                loaded = result["loaded"]
                assert loaded["steps"] == expected["steps"] and loaded["lr"] == expected["lr"]
                assert loaded["params"].keys() == expected["params"].keys()
                for param, states in expected["params"].items():
                    for key, value in states.items():
                        where = (n, name, param, key)
                        assert torch.equal(loaded["params"][param][key], value), where
                _same_training(result["stepped"], after[name], steps=1, start=start[name])
                assert result["unchanged"], (n, name)
    assert not [f for f in os.listdir(launched["folder"]) if f.startswith(".accel_universal")]


# -- on CUDA GPUs: saved by 2 NCCL processes, resumed on 1 ----------------------------------------
def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    return value


def _save_on_gpus(folder: str) -> dict[str, Any]:
    """ZeRO-2 and ZeRO-3 trained STEPS steps on 2 GPUs (half the global batch each), saved."""
    _worker_setup()
    from accel.utils import DeepSpeedPlugin

    out = {}
    for stage, name in RESHARD.items():
        acc = _accelerator(DeepSpeedPlugin(zero_stage=stage))
        with acc.deepspeed_plugin.zero3_init():
            net = make_net()
        model, opt, loader = acc.prepare(
            net, make_optimizer(net.parameters()), _loader(GLOBAL_BATCH // 2)
        )
        _train(acc, model, opt, loader, STEPS)
        acc.save_state(Path(folder) / name)
        out[name] = {"saved": _on_cpu(_zero_state(model)), "device": str(acc.device)}
    return out


def _resume_on_one_gpu(folder: str) -> dict[str, Any]:
    """Each checkpoint loaded by 1 GPU process (the universal conversion), one more step on
    the first GLOBAL_BATCH samples."""
    _worker_setup()
    from accel.utils import DeepSpeedPlugin

    x, y = dataset()[:GLOBAL_BATCH]
    out: dict[str, Any] = {}
    for stage, name in RESHARD.items():
        acc = _accelerator(DeepSpeedPlugin(zero_stage=stage))
        with acc.deepspeed_plugin.zero3_init():
            net = make_net()
        model, opt, _ = acc.prepare(net, make_optimizer(net.parameters()), _loader(GLOBAL_BATCH))
        acc.load_state(Path(folder) / name)
        loaded = _on_cpu(_zero_state(model))
        acc.backward(nn.functional.mse_loss(model(x.to(acc.device)), y.to(acc.device)))
        opt.step()
        opt.zero_grad()
        stepped = {k: v["fp32"] for k, v in _on_cpu(_zero_state(model))["params"].items()}
        out[name] = {"loaded": loaded, "stepped": stepped, "device": str(acc.device)}
    return out


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="saving ZeRO partitions of 2 NCCL ranks needs 2 GPUs"
)
def test_zero_checkpoints_of_two_gpus_resume_on_one(tmp_path):
    """As test_zero_checkpoints_resume_on_another_number_of_processes, on CUDA: ZeRO-2 and
    ZeRO-3 saved by 2 GPU processes load on 1 with the very same fp32 weights, Adam moments,
    step and lr; the next step is plain AdamW's from that state (float32 rounding)."""
    saved = run_distributed(_save_on_gpus, str(tmp_path), world_size=2, timeout=400)
    (resumed,) = run_distributed(_resume_on_one_gpu, str(tmp_path), world_size=1, timeout=400)
    for name in RESHARD.values():
        expected = saved[0][name]["saved"]
        assert [r[name]["device"] for r in saved] == ["cuda:0", "cuda:1"]
        assert resumed[name]["device"] == "cuda:0"
        loaded = resumed[name]["loaded"]
        assert loaded["steps"] == expected["steps"] == [float(STEPS)]
        assert loaded["lr"] == expected["lr"]
        for param, states in expected["params"].items():
            for key, value in states.items():
                assert torch.equal(loaded["params"][param][key], value), (name, param, key)
        start = {k: v["fp32"] for k, v in expected["params"].items()}
        _same_training(resumed[name]["stepped"], _one_more_step(expected), steps=1, start=start)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".accel_universal")]


def test_the_workers_ran_without_transformers(launched):
    assert all(r["transformers"] for r in launched["ranks"] + launched["again"])


@pytest.mark.slow
def test_cpu_adam_offload_trains_like_adamw():
    """First run on a machine compiles DeepSpeed's CPU Adam (~45 s); then it is cached."""
    rank0, _ = run_distributed(_cpu_offload, world_size=2, timeout=600)
    # DeepSpeedCPUAdam orders Adam's few operations its own way: rounding of the step, far
    # below the gradients' own
    _same_training(rank0["state"], reference(clip=AUTO_CLIP)["state"])
    assert rank0["transformers"]


# -- the settings, in this process (nothing here imports deepspeed) --------------------------------
def test_plugin_fields_make_a_config_and_a_written_config_wins_or_conflicts(tmp_path):
    from accel.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=3, offload_param_device="cpu", zero3_save_16bit_model=True)
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"] == {"device": "cpu"}
    assert plugin.deepspeed_config["gradient_clipping"] == "auto"  # filled with 1.0
    assert plugin.zero3_save_16bit_model is True
    written = {"gradient_accumulation_steps": 4, "zero_optimization": {"stage": "2"}}
    path = tmp_path / "ds.json"
    path.write_text(__import__("json").dumps(written))
    for source in (written, str(path), path.read_text()):
        assert DeepSpeedPlugin(hf_ds_config=source).zero_stage == 2
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=4 .* gives 2"):
        DeepSpeedPlugin(hf_ds_config=written, gradient_accumulation_steps=2)
    assert DeepSpeedPlugin(hf_ds_config=written, gradient_accumulation_steps=4).zero_stage == 2
    with pytest.raises(ValueError, match="neither an existing JSON file"):
        DeepSpeedPlugin(hf_ds_config="missing.json")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"offload_optimizer_device": "disk"}, r"'disk': accepted \['none', 'cpu', 'nvme'\]"),
        ({"offload_optimizer_device": "nvme"}, "needs offload_optimizer_nvme_path"),
        ({"zero_stage": 5}, "accepted stages are 0, 1, 2 and 3"),
        ({"enable_msamp": True}, "MS-AMP"),
    ],
)
def test_plugin_refuses_what_it_cannot_honour(kwargs, message):
    from accel.utils import DeepSpeedPlugin

    with pytest.raises(ValueError, match=message):
        DeepSpeedPlugin(**kwargs)


def test_settings_deepspeed_ignores_below_stage_3_warn_as_accelerate_does():
    from accel.utils import DeepSpeedPlugin

    with pytest.warns(UserWarning, match="ignores it here, so the parameters stay on the device"):
        plugin = DeepSpeedPlugin(zero_stage=2, offload_param_device="cpu")
    assert plugin.zero_stage == 2
    with pytest.warns(UserWarning, match=r"stage 2, so the flag is set to False"):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False


def test_mixed_precision_meets_the_config():
    from accel.utils import DeepSpeedPlugin

    assert DeepSpeedPlugin().set_mixed_precision("bf16") == "bf16"
    plugin = DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}})
    assert plugin.set_mixed_precision("no") == "bf16"  # the config enables it: the engine runs it
    with pytest.raises(ValueError, match=r"fp16.enabled=True .* mixed_precision is 'bf16'"):
        DeepSpeedPlugin(hf_ds_config={"fp16": {"enabled": True}}).set_mixed_precision("bf16")
    with pytest.raises(ValueError, match="'fp8' is not supported by the DeepSpeed strategy"):
        DeepSpeedPlugin().set_mixed_precision("fp8")


def test_auto_values_nothing_can_fill_are_errors_naming_the_key():
    from accel.utils import DeepSpeedPlugin, DummyOptim
    from accel_parallel._deepspeed_fill import fill_auto

    net = make_net()
    run = {"model": net, "scheduler": None, "accumulation_steps": 1, "data_parallel_size": 2}
    with pytest.raises(ValueError, match="no DataLoader with a batch_size was prepared"):
        fill_auto(DeepSpeedPlugin(), optimizer=None, micro_batch=None, **run)
    left = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {"stage": 2, "sub_group_size": "auto"}}
    )
    with pytest.raises(ValueError, match=r"\['zero_optimization.sub_group_size'\]"):
        fill_auto(left, optimizer=None, micro_batch=4, **run)
    with pytest.raises(ValueError, match='no "optimizer" section'):
        fill_auto(DeepSpeedPlugin(), optimizer=DummyOptim(net.parameters()), micro_batch=4, **run)
    both = DeepSpeedPlugin(hf_ds_config={"optimizer": {"type": "Adam", "params": {}}})
    with pytest.raises(ValueError, match="keep one"):
        fill_auto(both, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), micro_batch=4, **run)
    written = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": 8})
    with pytest.warns(UserWarning, match=r"batch size is 4 but the DeepSpeed config has 8"):
        assert fill_auto(written, optimizer=None, micro_batch=4, **run)["train_batch_size"] == 16
    filled = fill_auto(DeepSpeedPlugin(gradient_clipping=1.0), optimizer=None, micro_batch=4, **run)
    assert filled["gradient_clipping"] == 1.0 and filled["train_batch_size"] == 8  # asked for


def test_launch_section_keys_and_a_missing_deepspeed(monkeypatch):
    from accel_parallel import ProcessInfo, resolve_strategy
    from accel_parallel._deepspeed_plugin import DeepSpeedPlugin

    plugin = DeepSpeedPlugin.from_launch_config(
        {"zero_stage": "3", "zero3_init_flag": "true", "deepspeed_multinode_launcher": "pdsh"}
    )
    assert plugin.zero_stage == 3 and plugin.zero3_init_flag is True
    with pytest.raises(ValueError, match="deepspeed_config key 'zero_stge' is not known"):
        DeepSpeedPlugin.from_launch_config({"zero_stge": 3})
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "deepspeed" else real(name, *a),
    )
    with pytest.raises(ImportError, match=r"pip install accel-parallel\[deepspeed\]"):
        resolve_strategy(ProcessInfo(torch.device("cpu")), deepspeed_plugin=DeepSpeedPlugin())


def test_written_accumulation_steps_win_over_the_accelerator_at_prepare():
    """As in accelerate: a number in the config is what the Accelerator counts from prepare()
    on, with a warning naming both values."""
    written = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 3}
    from accel.utils import DeepSpeedPlugin

    acc = _accelerator(DeepSpeedPlugin(hf_ds_config=written), gradient_accumulation_steps=2)
    assert acc.gradient_accumulation_steps == 2
    loader = torch.utils.data.DataLoader(dataset(), batch_size=2)
    with pytest.warns(UserWarning, match="Accelerator has 2 but the DeepSpeed config has 3"):
        acc.prepare(loader)
    assert acc.gradient_accumulation_steps == 3 and acc.gradient_state.num_steps == 3
    syncs = []
    for _ in range(3):
        with acc.accumulate():
            syncs.append(acc.sync_gradients)
    assert syncs == [False, False, True]
