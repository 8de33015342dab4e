"""ParallelismConfig meshes through the Accelerator, for real: gloo workers on CPU.

Four launches (each costs seconds): a 4-process one trains dp_shard x tp and HSDP against
the 1-process reference, checks batches, metrics, scheduler and ranks, and saves a mesh
checkpoint mid-epoch; `accel launch` with --parallelism_config_* flags resumes it on 4
processes, and on 2 (tp alone: another data-parallel size); a 2-process one runs tensor
parallel alone (a plain model with a user plan, a transformers model with its own plan) and
pipeline inference.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from accel_state.testing import free_port, run_distributed
from accel_testkit.launch import LAUNCHER_VARS, launch_command, worker_env
from accel_testkit.models import Stack
from accel_testkit.tolerance import (
    assert_same_forward,
    assert_same_losses,
    assert_same_training,
    float32_error,
    norm_terms,
)

GLOBAL_BATCH, STEPS, SAVE_AT = 16, 4, 2
# Net: 6 linear layers, reductions of at most 64 terms (the 4 * 16 hidden features, 16 rows).
# SGD (linear in the gradient) rather than Adam: see accel_testkit.tolerance. Momentum gives
# the optimizer a state for the checkpoints to shard, save and load.
NET_ERROR = float32_error(layers=6, terms=64)  # a forward (and backward) pass
# The tiny Llama: 2 decoder layers of about 8 chained reductions each, embedding, norm, head
# and the loss: about 20 layers; 64 terms at most (intermediate size, vocabulary, 4 x 16 tokens).
LLAMA_ERROR, LLAMA_STEPS = float32_error(layers=20, terms=64), 3


class Net(Stack):
    """An MLP stack (inp: 8 -> 16, 2 blocks x + down(tanh(up(x))) of 16 -> 64 -> 16, out:
    16 -> 1); as transformers models do, it declares its tensor-parallel plan (and, from
    Stack, its unsplittable blocks)."""

    _tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}

    def __init__(self, width: int = 16) -> None:
        super().__init__(width=width, depth=2, hidden=4 * width)


class PlainNet(Net):
    """The same network without a declared plan: the user passes one."""

    _tp_plan = None


def make_net(cls: type = Net) -> nn.Module:
    torch.manual_seed(0)
    return cls()


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(GLOBAL_BATCH * STEPS, 8, generator=g)
    index = torch.arange(len(x))
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin(), index)


def reference(steps: int = STEPS) -> dict[str, torch.Tensor]:
    """One process, plain PyTorch, the whole global batch each step."""
    model = make_net()
    opt = make_optimizer(model.parameters())
    loader = torch.utils.data.DataLoader(dataset(), batch_size=GLOBAL_BATCH)
    for _, (x, y, _i) in zip(range(steps), loader):
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _setup(config: Any, cls: type = Net) -> tuple[Any, ...]:
    from accel import Accelerator, AcceleratorState

    AcceleratorState._reset_state()  # the process group stays; the next Accelerator adopts it
    acc = Accelerator(cpu=True, parallelism_config=config)
    dp = acc.parallelism_config.data_parallel_size
    model = make_net(cls)
    opt = make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=GLOBAL_BATCH // dp)
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    return acc, model, opt, sched, loader


def _steps(acc: Any, model: Any, opt: Any, sched: Any, batches: Any, n: int) -> list[list[int]]:
    seen = []
    for _, (x, y, index) in zip(range(n), batches):
        acc.backward(nn.functional.mse_loss(model(x), y))
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        seen.append(index.tolist())
    return seen


def _train(config: Any, cls: type = Net, save_to: str | None = None) -> dict:
    acc, model, opt, sched, loader = _setup(config, cls)
    batches = iter(loader)
    seen = _steps(acc, model, opt, sched, batches, SAVE_AT)
    if save_to:
        acc.save_state(save_to)
    seen += _steps(acc, model, opt, sched, batches, STEPS - SAVE_AT)
    return {
        "state": acc.get_state_dict(model),
        "seen": seen,
        "sched_steps": sched.scheduler.last_epoch,
        "metrics": _metrics(acc),
        "reduced": acc.reduce(torch.tensor([1.0]), "sum").item(),
        "ranks": {
            "tp": acc.tensor_parallel_rank,
            "dp_replicate": acc.data_parallel_rank,
            "dp_shard": acc.data_parallel_shard_rank,
        },
        "dims": list(acc.torch_device_mesh.mesh_dim_names),
        "dp_mesh": acc.torch_device_mesh["dp"].size() if acc.parallelism_config.dp_dim_names else 1,
        "strategy": acc.strategy.name,
        "dtensor_params": sum(hasattr(p, "device_mesh") for p in model.parameters()),
    }


def _metrics(acc: Any) -> list[int]:
    """gather_for_metrics over an uneven evaluation set: each sample exactly once."""
    data = torch.utils.data.TensorDataset(torch.arange(13))
    loader = acc.prepare(torch.utils.data.DataLoader(data, batch_size=2))
    out = []
    for (index,) in loader:
        out += acc.gather_for_metrics(index).tolist()
    return out


def _four_process_worker(folder: str) -> dict:
    from accel import ParallelismConfig

    return {
        "2d": _train(ParallelismConfig(dp_shard_size=2, tp_size=2), save_to=folder),
        "hsdp": _train(ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)),
    }


_RESUME_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
import test_mesh as t
from accel import Accelerator, AcceleratorState, ParallelismConfig
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch import nn

acc = Accelerator(cpu=True)
config = acc.parallelism_config
assert (config.dp_shard_size, config.tp_size) == ({dp_shard}, {tp})


def prepare(acc, dp):
    model = t.make_net()
    opt = t.make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    loader = torch.utils.data.DataLoader(t.dataset(), batch_size=t.GLOBAL_BATCH // dp)
    return acc.prepare(model, opt, sched, loader)


model, opt, sched, loader = prepare(acc, {dp_shard})
acc.load_state({folder!r})
full = StateDictOptions(full_state_dict=True, cpu_offload=True)
loaded = {{"state": acc.get_state_dict(model),
           "optimizer": get_optimizer_state_dict(model, opt.optimizer, options=full)}}
if acc.is_main_process:  # written now: training goes on in the same tensors
    torch.save(loaded, {out!r} + ".loaded")
seen = t._steps(acc, model, opt, sched, loader, t.STEPS - t.SAVE_AT)
state = acc.get_state_dict(model)
if acc.is_main_process:
    torch.save({{"state": state}}, {out!r})
strategy = None
if acc.num_processes == 2:  # a strategy without a mesh (DDP) reads the sharded folders whole
    AcceleratorState._reset_state()
    ddp = Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_replicate_size=2))
    model, opt, sched, loader = prepare(ddp, 2)
    ddp.load_state({folder!r})
    strategy = ddp.strategy.name
    loaded = {{"state": ddp.get_state_dict(model),
               "optimizer": get_optimizer_state_dict(ddp.unwrap_model(model), opt.optimizer)}}
    torch.save(loaded, {out!r} + f".ddp{{acc.process_index}}")
torch.save({{"seen": seen, "tp": acc.tensor_parallel_rank, "strategy": strategy}},
           {out!r} + f".{{acc.process_index}}")
acc.end_training()
"""


def _two_process_worker() -> dict:
    from accel import ParallelismConfig

    plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise", "out": "replicate"}
    out = {
        "tp_plain": _train(ParallelismConfig(tp_size=2, tp_plan=plan), cls=PlainNet),
        "tp_declared": _train(ParallelismConfig(tp_size=2)),
        "llama": _llama_tp(),
    }
    out.update(_pippy())
    return out


def _tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _llama_steps(model: Any, step: Any, ids: torch.Tensor) -> list[float]:
    losses = []
    for _ in range(LLAMA_STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        step(loss)
        losses.append(loss.item())
    return losses


def _llama_tp() -> dict:
    """A transformers model's own _tp_plan on tp=2 trains as on one process."""
    from accel import Accelerator, AcceleratorState, ParallelismConfig

    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(3))
    ref = _tiny_llama()
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)

    def ref_step(loss: torch.Tensor) -> None:
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()

    expected = _llama_steps(ref, ref_step, ids)
    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    model = _tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt = acc.prepare(model, opt)

    def step(loss: torch.Tensor) -> None:
        acc.backward(loss)
        opt.step()
        opt.zero_grad()

    losses = _llama_steps(model, step, ids)
    full = acc.get_state_dict(model)
    return {
        "losses": losses,
        "expected": expected,
        "split": sum(hasattr(p, "device_mesh") for p in model.parameters()),
        "state": full,
        "expected_state": ref.state_dict(),
        "start": start,
    }


def _pippy() -> dict:
    from accel import AcceleratorState, PartialState
    from accel.inference import prepare_pippy

    AcceleratorState._reset_state()
    state = PartialState()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    expected = make_net()(x).detach()
    out = {"pippy_expected": expected}
    for name, kwargs in (
        ("pippy_auto", {"split_points": "auto", "gather_output": True}),
        ("pippy_named", {"split_points": ["blocks.1"], "gather_output": False}),
    ):
        model = prepare_pippy(make_net().eval(), example_args=(x,), **kwargs)
        with torch.no_grad():
            result = model(x)
        out[name] = None if result is None else result.detach()
        out[name + "_split"] = model.hf_split_points
    out["rank"] = state.process_index
    return out


def _check_trained(
    result: dict,
    expected: dict[str, torch.Tensor],
    start: dict[str, torch.Tensor] | None = None,
    steps: int = STEPS,
) -> None:
    """The weights of `steps` steps from `start` (the initial weights by default) within
    float32 rounding of the expected ones: see accel_testkit.tolerance."""
    model = make_net()
    start = model.state_dict() if start is None else start
    clipped = norm_terms(model.parameters())
    bound = steps * float32_error(layers=6, terms=64, norm_terms=clipped)
    assert_same_training(result["state"], expected, start, bound)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    folder = tmp_path_factory.mktemp("mesh") / "ckpt"
    return run_distributed(_four_process_worker, str(folder), world_size=4, timeout=240), folder


@pytest.fixture(scope="module")
def two() -> list[dict]:
    return run_distributed(_two_process_worker, world_size=2, timeout=240)


def test_dp_shard_x_tp_equals_one_process(four: Any) -> None:
    results, _ = four
    expected = reference()
    _check_trained(results[0]["2d"], expected)
    first = results[0]["2d"]
    assert first["dims"] == ["dp_shard", "tp"] and first["dp_mesh"] == 2
    assert first["strategy"] == "fsdp" and first["dtensor_params"] == 12


def test_hsdp_equals_one_process(four: Any) -> None:
    results, _ = four
    _check_trained(results[0]["hsdp"], reference())
    assert results[0]["hsdp"]["dims"] == ["dp_replicate", "dp_shard"]


def test_batches_follow_data_parallel_ranks(four: Any) -> None:
    results, _ = four
    for variant, groups in (("2d", [[0, 1], [2, 3]]), ("hsdp", [[0], [1], [2], [3]])):
        seen = [r[variant]["seen"] for r in results]
        for group in groups:  # one tensor-parallel group reads the same batches
            assert all(seen[r] == seen[group[0]] for r in group)
        firsts = [seen[g[0]] for g in groups]
        for step in range(STEPS):  # the data-parallel ranks read disjoint ones, all of them
            rows = sorted(i for s in firsts for i in s[step])
            assert rows == list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))


def test_metrics_reduce_scheduler_and_ranks_count_data_parallel(four: Any) -> None:
    results, _ = four
    for rank, r in enumerate(results):
        for variant, dp in (("2d", 2), ("hsdp", 4)):
            assert r[variant]["metrics"] == list(range(13))
            assert r[variant]["reduced"] == dp
            assert r[variant]["sched_steps"] == STEPS * dp
        assert r["2d"]["ranks"] == {"tp": rank % 2, "dp_replicate": 0, "dp_shard": rank // 2}
        assert r["hsdp"]["ranks"] == {"tp": 0, "dp_replicate": rank // 2, "dp_shard": rank % 2}


def _launch_resume(folder: Path, tmp_path: Path, dp_shard: int, tp: int) -> Path:
    """`accel launch` of dp_shard x tp processes with --parallelism_config_* flags running
    _RESUME_SCRIPT on the checkpoint in `folder`; the path its results start with."""
    out = tmp_path / "resumed.pt"
    script = tmp_path / "resume.py"
    tests = str(Path(__file__).parent)
    script.write_text(
        _RESUME_SCRIPT.format(
            tests=tests, folder=str(folder), out=str(out), dp_shard=dp_shard, tp=tp
        )
    )
    env = worker_env(drop=LAUNCHER_VARS, XDG_CONFIG_HOME=str(tmp_path))  # no default config file
    cmd = launch_command(
        "--parallelism_config_dp_shard_size", dp_shard,
        "--parallelism_config_tp_size", tp,
        "--main_process_port", free_port(), script,
        num_processes=dp_shard * tp,
    )  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    problems = [ln for ln in proc.stderr.splitlines() if "rror" in ln or "terminate" in ln]
    assert proc.returncode == 0, "\n".join(problems[:40])
    return out


def _check_loaded_as_saved(folder: Path, out: Path, tmp_path: Path, suffix: str = "loaded") -> None:
    """Right after load_state, the full weights and optimizer state are the saved ones, bit
    for bit (the DCP folders read back whole, in this one process)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    loaded = torch.load(f"{out}.{suffix}", weights_only=True)
    for piece, key in (("pytorch_model_fsdp_0", "model"), ("optimizer_0", "optimizer")):
        dcp_to_torch_save(folder / piece, tmp_path / f"{piece}.pt")
        saved = torch.load(tmp_path / f"{piece}.pt", weights_only=True)[key]
        if key == "optimizer":  # names and hyperparameters, then the tensors
            assert loaded["optimizer"]["param_groups"] == saved["param_groups"]
            saved, now = saved["state"], loaded["optimizer"]["state"]
        else:
            now = loaded["state"]
        torch.testing.assert_close(now, saved, rtol=0, atol=0)


def test_accel_launch_resumes_mesh_checkpoint(four: Any, tmp_path: Path) -> None:
    """`accel launch` with --parallelism_config_* flags: a new 4-process run loads the mesh
    checkpoint saved mid-epoch and ends where the unbroken run ended."""
    results, folder = four
    out = _launch_resume(folder, tmp_path, dp_shard=2, tp=2)
    _check_loaded_as_saved(folder, out, tmp_path)
    resumed = torch.load(out, weights_only=True)
    # the same mesh, shards and batches on the same machine: the same sums in the same order
    for key, value in results[0]["2d"]["state"].items():
        torch.testing.assert_close(resumed["state"][key], value, rtol=0, atol=0)
    for rank in range(4):
        part = torch.load(f"{out}.{rank}", weights_only=True)
        assert part["seen"] == results[rank]["2d"]["seen"][SAVE_AT:]
        assert part["tp"] == rank % 2


def test_mesh_checkpoint_resumes_on_another_data_parallel_size(four: Any, tmp_path: Path) -> None:
    """The dp_shard=2 x tp=2 checkpoint on 2 processes, tp=2 alone (one data-parallel rank):
    DCP reshards the weights and the optimizer state exactly, the one rank reads the whole
    global batches the two read, and the run ends where the unbroken one ended. DDP (no mesh
    at all) on 2 processes reads the sharded folders whole: each process holds the weights and
    optimizer state exactly as saved."""
    results, folder = four
    out = _launch_resume(folder, tmp_path, dp_shard=1, tp=2)
    _check_loaded_as_saved(folder, out, tmp_path)
    loaded = torch.load(f"{out}.loaded", weights_only=True)["state"]  # where both went on from
    resumed = torch.load(out, weights_only=True)
    _check_trained(resumed, results[0]["2d"]["state"], loaded, steps=STEPS - SAVE_AT)
    for rank in range(2):
        part = torch.load(f"{out}.{rank}", weights_only=True)
        both = [results[0]["2d"]["seen"][SAVE_AT:], results[2]["2d"]["seen"][SAVE_AT:]]
        assert part["seen"] == [a + b for a, b in zip(*both)]
        assert part["tp"] == rank
        assert part["strategy"] == "ddp"
        _check_loaded_as_saved(folder, out, tmp_path, suffix=f"ddp{rank}")


def test_tensor_parallel_plain_model_with_user_plan(two: list[dict]) -> None:
    expected = reference()
    _check_trained(two[0]["tp_plain"], expected)
    assert two[0]["tp_plain"]["strategy"] == "tp"
    assert two[0]["tp_plain"]["dtensor_params"] == 10  # the blocks split, `out` replicated
    for r in two:  # tensor parallel alone: one data-parallel replica
        assert r["tp_plain"]["seen"] == two[0]["tp_plain"]["seen"]
        assert r["tp_plain"]["metrics"] == list(range(13))
        assert r["tp_plain"]["sched_steps"] == STEPS


def test_tensor_parallel_declared_plan(two: list[dict]) -> None:
    _check_trained(two[0]["tp_declared"], reference())
    assert two[0]["tp_declared"]["dtensor_params"] == 8


def test_transformers_model_uses_its_tp_plan(two: list[dict]) -> None:
    llama = two[0]["llama"]
    assert llama["split"] > 0
    bound = LLAMA_STEPS * LLAMA_ERROR  # SGD, float32 rounding only: see accel_testkit.tolerance
    assert_same_training(llama["state"], llama["expected_state"], llama["start"], bound)
    assert_same_losses(llama["losses"], llama["expected"], forward=LLAMA_ERROR, bound=bound)


def test_prepare_pippy_two_stages_equals_unsplit(two: list[dict]) -> None:
    first, last = sorted(two, key=lambda r: r["rank"])
    assert (
        first["pippy_auto_split"] == last["pippy_auto_split"]
        and len(first["pippy_auto_split"]) == 1
    )
    assert first["pippy_named_split"] == ["blocks.1"]
    for r in (first, last):  # gather_output=True: every process has the output
        assert_same_forward(r["pippy_auto"], r["pippy_expected"], NET_ERROR)
    assert_same_forward(last["pippy_named"], last["pippy_expected"], NET_ERROR)
    assert first["pippy_named"] is None  # without gather_output: on the last process only


# -- in one process ---------------------------------------------------------------------------


def test_generate_device_map_balances_without_splitting_blocks() -> None:
    from accel.inference import generate_device_map

    stages = generate_device_map(make_net(), 2)
    assert stages == {"inp": 0, "blocks.0": 0, "blocks.1": 1, "out": 1}
    assert max(generate_device_map(make_net(), 4).values()) == 3
    with pytest.raises(ValueError, match="fewer than the 5 stages"):
        generate_device_map(make_net(), 5)


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="context parallel needs 2 CUDA GPUs (ring attention)"
)
def test_context_parallel_attention_matches_full_on_gpu() -> None:
    results = run_distributed(_cp_worker, world_size=2, timeout=240)
    for r in results:
        assert r["close"], r


def _cp_worker() -> dict:
    """SDPA under maybe_context_parallel on cp=2 equals the full attention's slice."""
    from accel import Accelerator, ParallelismConfig

    acc = Accelerator(parallelism_config=ParallelismConfig(cp_size=2))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g).to(acc.device) for _ in range(3))
    full = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with acc.maybe_context_parallel(buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        local = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch's load balancer reorders the sequence: compare norms of the whole instead.
    total = local.float().pow(2).sum().reshape(1)
    torch.distributed.all_reduce(total)
    return {"close": bool(torch.allclose(total, full.float().pow(2).sum().reshape(1), rtol=1e-3))}
