"""Pipeline parallel through the Accelerator, for real: gloo workers on CPU.

Two launches (each costs seconds). A 2-process one (pp=2) trains a plain torch model with
1F1B and Interleaved 1F1B, with gradient accumulation, under bf16 and fp16, a tiny Llama with
its decoder-layer plan (1F1B, Interleaved 1F1B, a padding attention_mask), a MegatronLMPlugin
run and its ParallelismConfig twin, and saves / resumes a pipeline checkpoint; each is
compared with one process training on the same global batch. A 4-process one composes the pipeline with tensor
parallel and with FSDP2, and runs MegatronLMPlugin's sequence parallelism with and without a
pipeline. The pipeline checkpoint is then loaded on one process, without pipelining, for
evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from accel_state.testing import run_distributed
from accel_testkit.models import Stack
from accel_testkit.tolerance import (
    assert_same_forward,
    assert_same_losses,
    assert_same_training,
    float32_error,
    norm_terms,
)

BATCH, STEPS = 16, 3
# Net: 10 linear layers, reductions of at most 32 terms (2 * 16 hidden features, 16 rows).
# SGD (linear in the gradient) rather than Adam: see accel_testkit.tolerance. Momentum gives
# the optimizer a state for the pipeline checkpoint to save and load.
NET_ERROR = float32_error(layers=10, terms=32)  # a forward (and backward) pass
# The tiny Llama: 4 decoder layers of about 8 chained reductions each, embedding, norm, head
# and the loss: about 36 layers; 128 terms at most (8 x 16 tokens).
LLAMA_ERROR = float32_error(layers=36, terms=128)


class Net(Stack):
    """inp: 8 -> 16, 4 blocks x + down(tanh(up(x))) of 16 -> 32 -> 16, out: 16 -> 1 (its
    name shows in the pipeline's refusals). Unlike Stack it declares no unsplittable blocks:
    FSDP's default wrap policy gives the blocks no shard group of their own."""

    _no_split_modules = None

    def __init__(self, width: int = 16) -> None:
        super().__init__(width=width, depth=4, hidden=2 * width)


PLAN = ["inp", "blocks", "out"]
TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH * STEPS, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = data()
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(STEPS)]


def reference_net(dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, plain PyTorch, the whole batch each step, clipped to norm 0.5 (under
    autocast to `dtype` when given)."""
    model = make_net()
    opt = make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    losses, skipped = [], 0
    for x, y in batches():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < before
        opt.zero_grad()
        losses.append(loss.item())
    if dtype == torch.float16:
        assert skipped > 0  # the scale overflowed at least once: the skip is part of the check
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


def llama_batch(padded: bool = False) -> dict[str, torch.Tensor]:
    """Token ids, labels and mask; `padded`: right padding of a different length in each
    row (so micro-batches count different numbers of tokens), its labels -100."""
    ids = token_ids()
    mask = torch.ones_like(ids)
    if padded:
        for row in range(ids.shape[0]):
            mask[row, 16 - 2 * row :] = 0
    return {"input_ids": ids, "labels": ids.masked_fill(mask == 0, -100), "attention_mask": mask}


def reference_llama(padded: bool = False) -> tuple[dict[str, torch.Tensor], list[float]]:
    model = tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    batch, losses = llama_batch(padded), []
    for _ in range(STEPS):
        loss = model(**batch).loss
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
    opt = make_optimizer(model.parameters())
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
    split = sum(hasattr(p, "device_mesh") for p in model.parameters())  # DTensors (TP, FSDP2)
    return {
        "state": acc.get_state_dict(model),
        "losses": losses,
        "strategy": acc.strategy.name,
        "split": split,
    }


def _resume_net(config: Any, folder: str) -> dict:
    acc = _accelerator(parallelism_config=config)
    model = make_net()
    opt = make_optimizer(model.parameters())
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


def _train_llama(padded: bool = False, **kwargs: Any) -> dict:
    acc = _accelerator(**kwargs)
    model = tiny_llama()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model, opt = acc.prepare(model, opt)
    batch, losses = llama_batch(padded), []
    for _ in range(STEPS):
        out = model(**batch)
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
        "recompute": getattr(acc.strategy, "recompute", False),
        "strategy": acc.strategy.name,
        "split": sum(hasattr(p, "device_mesh") for p in model.parameters()),
    }


def _two_process_worker(folder: str) -> dict:
    from accel import ParallelismConfig
    from accel.utils import MegatronLMPlugin

    def net(schedule: str, **kw: Any) -> Any:
        return ParallelismConfig(pp_size=2, pp_schedule=schedule, pp_plan=PLAN,
                                 pp_loss_fn=nn.functional.mse_loss, **kw)  # fmt: skip

    out = {
        "llama_reference": reference_llama(),  # here: transformers is imported here anyway
        "llama_start": tiny_llama().state_dict(),
        "1f1b": _train_net(net("1F1B", pp_microbatches=4), save_at=folder),
        "interleaved": _train_net(net("Interleaved1F1B", pp_microbatches=4)),
        "accumulated": _train_net(net("1F1B", pp_microbatches=2), accumulate=2),
        "bf16": _train_net(net("1F1B", pp_microbatches=4), mixed_precision="bf16"),
        "resumed": _resume_net(net("1F1B", pp_microbatches=4), folder),
        "fp16": _train_net(net("1F1B", pp_microbatches=4), mixed_precision="fp16"),
        "llama": _train_llama(parallelism_config=ParallelismConfig(pp_size=2, pp_microbatches=4)),
        "llama_padded_reference": reference_llama(padded=True),
        "llama_padded": _train_llama(
            padded=True, parallelism_config=ParallelismConfig(pp_size=2, pp_microbatches=4)
        ),
        "llama_interleaved": _train_llama(
            parallelism_config=ParallelismConfig(
                pp_size=2, pp_schedule="Interleaved1F1B", pp_microbatches=4
            )
        ),
        "megatron": _train_llama(
            megatron_lm_plugin=MegatronLMPlugin(
                pp_degree=2, num_micro_batches=4, gradient_clipping=0.5, recompute_activations=True
            )
        ),
    }
    acc = _accelerator(parallelism_config=net("1F1B", pp_microbatches=4))
    model = acc.prepare(make_net())
    acc.save_model(model, folder + "_export")
    x, y = batches()[0]
    try:  # a module plan's stages take one input: a padding mask is refused
        model(x, labels=y, attention_mask=torch.zeros(BATCH, 8))
    except ValueError as error:
        out["mask_refused"] = str(error)
    return out


def _four_process_worker() -> dict:
    from accel import ParallelismConfig
    from accel.utils import MegatronLMPlugin

    sequence = MegatronLMPlugin(
        tp_degree=2, pp_degree=2, num_micro_batches=2, sequence_parallelism=True
    )
    return {
        "megatron_sp": _train_llama(megatron_lm_plugin=sequence),
        "megatron_sp_fsdp": _train_llama(  # no pipeline: tp=2 x dp_shard=2
            megatron_lm_plugin=MegatronLMPlugin(
                tp_degree=2, sequence_parallelism=True, use_distributed_optimizer=True
            )
        ),
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
def _same_net(result: dict, expected: tuple[dict[str, torch.Tensor], list[float]],
              losses_only: bool = False) -> None:  # fmt: skip
    """Net's weights and losses after STEPS steps from make_net() within float32 rounding of
    the expected ones (SGD: see accel_testkit.tolerance)."""
    state, losses = expected
    model = make_net()
    bound = STEPS * float32_error(layers=10, terms=32, norm_terms=norm_terms(model.parameters()))
    assert_same_losses(result["losses"], losses, forward=NET_ERROR, bound=bound)
    if not losses_only:
        assert_same_training(result["state"], state, model.state_dict(), bound)


def _same_llama(result: dict, expected: tuple[dict[str, torch.Tensor], list[float]],
                start: dict[str, torch.Tensor], losses_only: bool = False) -> None:  # fmt: skip
    """The same for the tiny Llama, from `start`, its initial weights."""
    state, losses = expected
    bound = STEPS * float32_error(layers=36, terms=128, norm_terms=norm_terms(start.values()))
    assert_same_losses(result["losses"], losses, forward=LLAMA_ERROR, bound=bound)
    if not losses_only:
        assert_same_training(result["state"], state, start, bound)


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
    expected = reference_net()
    for rank in results:  # every stage's weights, and the loss on every rank
        _same_net(rank[schedule], expected)
        assert rank[schedule]["strategy"] == "pipeline"


def _gpu_pipeline_worker(schedules: list[str]) -> dict:
    """pp=2 over NCCL, one GPU per stage: Net trained with each schedule, as `_train_net`."""
    from accel import Accelerator, AcceleratorState, ParallelismConfig

    out = {}
    for schedule in schedules:
        AcceleratorState._reset_state()  # the process group stays; the next one adopts it
        config = ParallelismConfig(pp_size=2, pp_schedule=schedule, pp_plan=PLAN,
                                   pp_loss_fn=nn.functional.mse_loss, pp_microbatches=4)  # fmt: skip
        acc = Accelerator(parallelism_config=config)
        model = make_net()
        opt = make_optimizer(model.parameters())
        model, opt = acc.prepare(model, opt)
        losses = []
        for x, y in batches():
            out_ = model(x.to(acc.device), labels=y.to(acc.device))
            acc.backward(out_.loss)
            acc.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            loss = torch.tensor([out_.loss.item()], device=acc.device)  # NCCL: a GPU tensor
            losses.append(acc.reduce(loss, "mean").item())
        out[schedule] = {
            "state": {k: v.detach().cpu() for k, v in acc.get_state_dict(model).items()},
            "losses": losses,
            "strategy": acc.strategy.name,
            "device": str(acc.device),
            "backend": torch.distributed.get_backend(),
        }
    return out


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="a pipeline of 2 stages over NCCL needs 2 CUDA GPUs"
)
def test_pp2_schedules_on_two_gpus_equal_one_process() -> None:
    """1F1B and Interleaved 1F1B with the stages on cuda:0 and cuda:1 (NCCL sends the
    activations and gradients) train Net as one CPU process does, within float32 rounding."""
    schedules = ["1F1B", "Interleaved1F1B"]
    results = run_distributed(_gpu_pipeline_worker, schedules, world_size=2, timeout=300)
    expected = reference_net()
    for rank, result in enumerate(results):
        for schedule in schedules:
            got = result[schedule]
            assert got["device"] == f"cuda:{rank}" and got["backend"] == "nccl"
            assert got["strategy"] == "pipeline"
            _same_net(got, expected)


def test_micro_batches_and_accumulation_equal_one_large_batch(two: Any) -> None:
    results, _ = two
    expected = reference_net()
    _same_net(results[0]["accumulated"], expected)
    _same_net(results[1]["accumulated"], expected, losses_only=True)


def _drift(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """How far `state` is from `expected`, relative to how far training moved `expected`, over
    all the weights at once (a single tensor's rounding can be large beside its own small
    movement: the output bias's gradient is a sum of terms of both signs)."""
    init = make_net().state_dict()
    apart = sum(float(((state[k] - v) ** 2).sum()) for k, v in expected.items())
    moved = sum(float(((v - init[k]) ** 2).sum()) for k, v in expected.items())
    return (apart / moved) ** 0.5


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_mixed_precision_runs_inside_the_stages(two: Any, mode: str) -> None:
    """Autocast inside the stages (fp16 too: it runs on CPU) equals one process under the
    same autocast within its rounding. Under fp16 both scale the loss before the backward and
    skip the steps whose scaled backward overflows."""
    results, _ = two
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[mode]
    expected, losses = reference_net(dtype)
    fp32_losses = reference_net()[1]
    # Each micro-batch's weight gradients come out of the autocast matmuls rounded to the
    # dtype's precision (2**-8, 2**-11) before they are summed, where one process rounds
    # their sum once: a step's gradients differ by about that fraction, STEPS steps' weights
    # by about STEPS times it.
    bound = STEPS * {"bf16": 2.0**-8, "fp16": 2.0**-11}[mode]
    assert sorted(results[0][mode]["state"]) == sorted(expected)
    assert _drift(results[0][mode]["state"], expected) <= bound
    for result in results:
        assert_same_losses(result[mode]["losses"], losses, forward=NET_ERROR, bound=bound)
        # autocast was on: the first loss (the same weights) is the autocast one up to
        # float32 rounding, and closer to it than to the float32 one
        first = result[mode]["losses"][0]
        assert abs(first - losses[0]) < abs(first - fp32_losses[0])


@pytest.mark.parametrize("case", ["llama", "llama_interleaved", "llama_padded"])
def test_pp2_llama_equals_one_process(two: Any, case: str) -> None:
    """1F1B, Interleaved 1F1B with two virtual stages per rank (one decoder layer each), and
    a padding attention_mask (each stage gets its micro-batch's slice; the micro-batches'
    losses weighed by their tokens, as one process averages them)."""
    results, _ = two
    reference = "llama_padded_reference" if case == "llama_padded" else "llama_reference"
    for rank, result in enumerate(results):
        _same_llama(result[case], results[0][reference], results[0]["llama_start"])
        assert result[case]["pp_rank"] == rank


def test_padding_mask_on_a_module_plan_is_refused_with_the_fix(two: Any) -> None:
    results, _ = two
    for result in results:
        assert "decoder model only; Net is cut by a module plan" in result["mask_refused"]
        assert "Pack the sequences" in result["mask_refused"]


def test_megatron_plugin_equals_its_parallelism_config(two: Any) -> None:
    """tp/pp/micro-batches, gradient_clipping (clipped inside optimizer.step) and
    recompute_activations (blocks recomputed in backward: the same numbers). The two runs
    split the work the same way on the same machine: the same sums in the same order."""
    results, _ = two
    for result in results:
        assert result["megatron"]["strategy"] == "pipeline" and result["megatron"]["recompute"]
        state, twin = result["megatron"]["state"], result["llama"]["state"]
        assert state.keys() == twin.keys()
        assert all(torch.equal(state[k], v) for k, v in twin.items())
        assert result["megatron"]["losses"] == result["llama"]["losses"]


def test_pipeline_checkpoint_resumes_exactly(two: Any) -> None:
    results, _ = two
    # the same stages and micro-batches after the load: the same sums in the same order
    resumed, unbroken = results[0]["resumed"]["state"], results[0]["1f1b"]["state"]
    assert resumed.keys() == unbroken.keys()
    assert all(torch.equal(resumed[k], v) for k, v in unbroken.items())
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
    opt = make_optimizer(model.parameters())
    model, opt = acc.prepare(model, opt)
    acc.load_state(str(folder))
    with torch.no_grad():
        logits = model(data()[0][:BATCH])
    for result in results:  # the eval outputs came back on both pipeline ranks
        assert_same_forward(result["resumed"]["eval_after_load"], logits, NET_ERROR)
    assert opt.state_dict()["state"], "the optimizer state was loaded"
    exported = load_file(str(folder) + "_export/model.safetensors")
    initial = make_net().state_dict()
    assert set(exported) == set(initial)
    assert all(torch.equal(exported[k], v) for k, v in initial.items())  # untrained: a copy
    AcceleratorState._reset_state()


def test_pp2_x_tp2_and_pp2_x_dp_shard2_equal_one_process(four: list[dict]) -> None:
    expected = reference_net()
    for case in ("pp_tp", "pp_fsdp"):
        _same_net(four[0][case], expected)
        for rank in four:
            _same_net(rank[case], expected, losses_only=True)
            assert rank[case]["split"] > 0  # the stage's weights really are split


def test_megatron_sequence_parallelism_equals_one_process(four: list[dict]) -> None:
    """MegatronLMPlugin(tp_degree=2, sequence_parallelism=True): norms on slices of the
    sequence, with pp_degree=2 (the stages pass slices) and without a pipeline (beside FSDP2)."""
    expected = reference_llama()
    start = tiny_llama().state_dict()
    for rank in four:
        _same_llama(rank["megatron_sp"], expected, start)
        _same_llama(rank["megatron_sp_fsdp"], expected, start, losses_only=True)
        for case in ("megatron_sp", "megatron_sp_fsdp"):
            assert rank[case]["split"] > 0
    _same_llama(four[0]["megatron_sp_fsdp"], expected, start)
