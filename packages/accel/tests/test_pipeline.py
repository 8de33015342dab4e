"""Pipeline parallel through the Accelerator, for real: gloo workers on CPU.

Two launches (each costs seconds). A 2-process one (pp=2) trains a plain torch model with
1F1B and Interleaved 1F1B, with gradient accumulation, a tiny Llama with its decoder-layer
plan, a MegatronLMPlugin run and its ParallelismConfig twin, and saves / resumes a pipeline
checkpoint; each is compared with one process training on the same global batch. A
4-process one composes the pipeline with tensor parallel and with FSDP2. The pipeline
checkpoint is then loaded on one process, without pipelining, for evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from accel_state.testing import run_distributed

BATCH, STEPS = 16, 3


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(4))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


PLAN = ["inp", "blocks", "out"]
TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH * STEPS, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = data()
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(STEPS)]


def reference_net(dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, plain PyTorch, the whole batch each step, clipped to norm 0.5."""
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def token_ids() -> torch.Tensor:
    return torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(3))


def reference_llama() -> tuple[dict[str, torch.Tensor], list[float]]:
    model = tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids, losses = token_ids(), []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


# -- workers -------------------------------------------------------------------------------------
def _accelerator(**kwargs: Any) -> Any:
    from accel import Accelerator, AcceleratorState

    AcceleratorState._reset_state()  # the process group stays; the next Accelerator adopts it
    return Accelerator(cpu=True, **kwargs)


def _train_net(config: Any, accumulate: int = 1, save_at: str | None = None, **kwargs: Any) -> dict:
    acc = _accelerator(parallelism_config=config, gradient_accumulation_steps=accumulate, **kwargs)
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    dp, rank = acc.strategy.data_parallel_size, acc.strategy.data_parallel_rank
    losses = []
    for step, (x, y) in enumerate(batches()):
        x, y = x.chunk(dp)[rank], y.chunk(dp)[rank]  # this data-parallel rank's share
        step_loss = 0.0
        for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
            with acc.accumulate(model):
                out = model(xs, labels=ys)
                acc.backward(out.loss)
                acc.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                opt.zero_grad()
            step_loss += out.loss.item() / accumulate
        losses.append(acc.reduce(torch.tensor([step_loss]), "mean").item())
        if save_at and step == 0:
            acc.save_state(save_at)
    return {"state": acc.get_state_dict(model), "losses": losses, "strategy": acc.strategy.name}


def _resume_net(config: Any, folder: str) -> dict:
    acc = _accelerator(parallelism_config=config)
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    acc.load_state(folder)
    whole = acc.strategy.optimizer_state_dict(opt.optimizer, model)  # every stage's entries
    acc.strategy.load_optimizer_state_dict(opt.optimizer, whole, model)
    model.eval()
    with torch.no_grad():
        evaluated = model(data()[0][:BATCH]).logits
    model.train()
    for x, y in batches()[1:]:
        acc.backward(model(x, labels=y).loss)
        acc.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
    names = {k.split(".", 1)[1].rsplit(".", 1)[0] for k in whole if k.startswith("state.")}
    return {"state": acc.get_state_dict(model), "eval_after_load": evaluated, "opt_names": names}


def _train_llama(**kwargs: Any) -> dict:
    acc = _accelerator(**kwargs)
    model = tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt = acc.prepare(model, opt)
    ids, losses = token_ids(), []
    for _ in range(STEPS):
        out = model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids))
        acc.backward(out.loss)
        if acc.strategy.clip_norm is None:  # the MegatronLMPlugin run clips by itself
            acc.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return {
        "state": acc.get_state_dict(model),
        "losses": losses,
        "pp_rank": acc.pipeline_parallel_rank,
        "recompute": acc.strategy.recompute,
        "strategy": acc.strategy.name,
    }


def _two_process_worker(folder: str) -> dict:
    from accel import ParallelismConfig
    from accel.utils import MegatronLMPlugin

    def net(schedule: str, **kw: Any) -> Any:
        return ParallelismConfig(pp_size=2, pp_schedule=schedule, pp_plan=PLAN,
                                 pp_loss_fn=nn.functional.mse_loss, **kw)  # fmt: skip

    out = {
        "llama_reference": reference_llama(),  # here: transformers is imported here anyway
        "1f1b": _train_net(net("1F1B", pp_microbatches=4), save_at=folder),
        "interleaved": _train_net(net("Interleaved1F1B", pp_microbatches=4)),
        "accumulated": _train_net(net("1F1B", pp_microbatches=2), accumulate=2),
        "bf16": _train_net(net("1F1B", pp_microbatches=4), mixed_precision="bf16"),
        "resumed": _resume_net(net("1F1B", pp_microbatches=4), folder),
        "llama": _train_llama(parallelism_config=ParallelismConfig(pp_size=2, pp_microbatches=4)),
        "megatron": _train_llama(
            megatron_lm_plugin=MegatronLMPlugin(
                pp_degree=2, num_micro_batches=4, gradient_clipping=0.5, recompute_activations=True
            )
        ),
    }
    acc = _accelerator(parallelism_config=net("1F1B", pp_microbatches=4))
    model = acc.prepare(make_net())
    acc.save_model(model, folder + "_export")
    return out


def _four_process_worker() -> dict:
    from accel import ParallelismConfig

    return {
        "pp_tp": _train_net(
            ParallelismConfig(
                pp_size=2,
                tp_size=2,
                tp_plan=TP_PLAN,
                pp_plan=PLAN,
                pp_microbatches=2,
                pp_loss_fn=nn.functional.mse_loss,
            )
        ),
        "pp_fsdp": _train_net(
            ParallelismConfig(
                pp_size=2,
                dp_shard_size=2,
                pp_plan=PLAN,
                pp_microbatches=2,
                pp_loss_fn=nn.functional.mse_loss,
            )
        ),
    }


# -- checks --------------------------------------------------------------------------------------
def _close(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(state) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    folder = tmp_path_factory.mktemp("pipeline") / "ckpt"
    return run_distributed(_two_process_worker, str(folder), world_size=2, timeout=300), folder


@pytest.fixture(scope="module")
def four() -> list[dict]:
    return run_distributed(_four_process_worker, world_size=4, timeout=300)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_pp2_plain_model_equals_one_process(two: Any, schedule: str) -> None:
    results, _ = two
    expected, losses = reference_net()
    for rank in results:  # every stage's weights, and the loss on every rank
        _close(rank[schedule]["state"], expected)
        assert rank[schedule]["losses"] == pytest.approx(losses, rel=1e-5)
        assert rank[schedule]["strategy"] == "pipeline"


def test_micro_batches_and_accumulation_equal_one_large_batch(two: Any) -> None:
    results, _ = two
    expected, losses = reference_net()
    _close(results[0]["accumulated"]["state"], expected)
    assert results[1]["accumulated"]["losses"] == pytest.approx(losses, rel=1e-5)


def test_mixed_precision_runs_inside_the_stages(two: Any) -> None:
    results, _ = two
    _, bf16 = reference_net(torch.bfloat16)
    _, fp32 = reference_net()
    for result in results:
        assert result["bf16"]["losses"] == pytest.approx(bf16, rel=2e-2)
        assert result["bf16"]["losses"] != pytest.approx(fp32, rel=1e-6)  # autocast was on


def test_pp2_llama_equals_one_process(two: Any) -> None:
    results, _ = two
    expected, losses = results[0]["llama_reference"]
    for rank, result in enumerate(results):
        _close(result["llama"]["state"], expected)
        assert result["llama"]["losses"] == pytest.approx(losses, rel=1e-5)
        assert result["llama"]["pp_rank"] == rank


def test_megatron_plugin_equals_its_parallelism_config(two: Any) -> None:
    """tp/pp/micro-batches, gradient_clipping (clipped inside optimizer.step) and
    recompute_activations (blocks recomputed in backward: the same numbers)."""
    results, _ = two
    for result in results:
        assert result["megatron"]["strategy"] == "pipeline" and result["megatron"]["recompute"]
        _close(result["megatron"]["state"], result["llama"]["state"])
        assert result["megatron"]["losses"] == result["llama"]["losses"]


def test_pipeline_checkpoint_resumes_exactly(two: Any) -> None:
    results, _ = two
    _close(results[0]["resumed"]["state"], results[0]["1f1b"]["state"])
    for result in results:  # optimizer_state_dict gathers every stage's entries
        assert result["resumed"]["opt_names"] == {n for n, _ in make_net().named_parameters()}


def test_pipeline_checkpoint_loads_on_one_process_for_eval(two: Any) -> None:
    """pp=2 -> 1: the DCP checkpoint loads into an unsplit model; it evaluates the same."""
    from safetensors.torch import load_file

    from accel import Accelerator, AcceleratorState

    results, folder = two
    AcceleratorState._reset_state()
    acc = Accelerator(cpu=True)
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    acc.load_state(str(folder))
    with torch.no_grad():
        logits = model(data()[0][:BATCH])
    for result in results:  # the eval outputs came back on both pipeline ranks
        torch.testing.assert_close(logits, result["resumed"]["eval_after_load"])
    assert opt.state_dict()["state"], "the optimizer state was loaded"
    exported = load_file(str(folder) + "_export/model.safetensors")
    assert set(exported) == set(make_net().state_dict())
    _close(exported, make_net().state_dict())
    AcceleratorState._reset_state()


def test_pp2_x_tp2_and_pp2_x_dp_shard2_equal_one_process(four: list[dict]) -> None:
    expected, losses = reference_net()
    for case in ("pp_tp", "pp_fsdp"):
        _close(four[0][case]["state"], expected)
        for rank in four:
            assert rank[case]["losses"] == pytest.approx(losses, rel=1e-5)
