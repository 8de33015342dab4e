"""DeepSpeed's sequence parallel (ALST / Ulysses) through the Accelerator, for real: accelerate's
recipe (its script test_ds_alst_ulysses_sp.py) on 2 gloo processes with DeepSpeed ZeRO-2 on CPU,
a tiny Llama made from a config, compared with one process of plain transformers that sees
each whole sequence.

One 2-process launch checks everything that needs processes (each launch costs seconds of
imports): the loader's slices, the aggregated loss of each step, the trained weights, the
model that arrived in eval mode and the backward refused in eval mode.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from typing import Any

import pytest
import torch

from accel_state.testing import run_distributed
from accel_testkit.tolerance import (
    assert_same_losses,
    assert_same_training,
    float32_error,
    norm_terms,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None
    or importlib.util.find_spec("transformers") is None,
    reason="needs deepspeed and transformers (pip install accel-parallel[deepspeed] transformers)",
)

SAMPLES, SEQ, VOCAB, LR, CLIP = 4, 32, 128, 0.5, 1.0  # CLIP: "auto" gradient_clipping
HIDDEN, INTERMEDIATE, LAYERS = 64, 128, 2


def make_model() -> Any:
    """A tiny Llama made from a config, in eval mode as from_pretrained returns it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=SEQ, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def samples() -> list[dict[str, torch.Tensor]]:
    """Whole sequences; the first tokens of sample 1's labels are masked (-100), so that the
    two halves of its sequence count different numbers of tokens in the loss."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(SAMPLES):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        labels = ids.clone()
        if i == 1:
            labels[:20] = -100
        out.append({"input_ids": ids, "position_ids": torch.arange(SEQ), "labels": labels})
    return out


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


def reference() -> dict[str, Any]:
    """One process of plain transformers: one whole sequence per step, SGD, clipped at CLIP."""
    model = make_model().train()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for sample in samples():
        loss = model(**collate([sample])).loss
        losses.append(float(loss))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
    return {"losses": losses, "state": model.state_dict(), "start": start}


# -- in the workers ------------------------------------------------------------------------------
def _sequence_parallel_run() -> dict[str, Any]:
    """accelerate's script, with its imports saying accel."""
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # DeepSpeed's autotuner, unused
    from accel import Accelerator
    from accel.utils import DeepSpeedPlugin, ParallelismConfig
    from accel.utils.dataclasses import DeepSpeedSequenceParallelConfig

    config = ParallelismConfig(
        sp_backend="deepspeed",
        sp_size=2,
        sp_handler=DeepSpeedSequenceParallelConfig(
            sp_seq_length=SEQ, sp_seq_length_is_variable=True, sp_attn_implementation="sdpa"
        ),
    )
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), parallelism_config=config)
    model = make_model()
    loader = torch.utils.data.DataLoader(samples(), batch_size=1, collate_fn=collate)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer, dl = acc.prepare(model, optimizer, loader)
    from deepspeed.utils import groups

    sp_group = groups._get_sequence_parallel_group()
    sp_world_size = config.sp_size
    unwrapped = acc.unwrap_model(model)
    out: dict[str, Any] = {
        "warnings": [str(w.message) for w in caught],
        "training_after_prepare": unwrapped.training,
        "len": len(dl),
        "engine": type(model).__name__,
        "train_batch_size": acc.deepspeed_config["train_batch_size"],
        "data_parallel_size": acc.parallelism_config.data_parallel_size,
        "losses": [],
        "slices": [],
    }
    for batch in dl:
        out["slices"].append({k: v.clone() for k, v in batch.items()})
        outputs = model(**batch)
        shift_labels = batch["shift_labels"]
        loss = unwrapped.loss_function(
            logits=outputs.logits, labels=None, shift_labels=shift_labels,
            vocab_size=unwrapped.config.vocab_size,
        )  # fmt: skip
        # accelerate's aggregation: a differentiable all-gather of the per-rank losses,
        # weighted by the tokens each rank counted
        losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
        good_tokens = (shift_labels != -100).view(-1).sum()
        good_per_rank = torch.distributed.nn.functional.all_gather(good_tokens, group=sp_group)
        total = sum(
            losses_per_rank[r] * good_per_rank[r]
            for r in range(sp_world_size)
            if good_per_rank[r] > 0
        )
        loss = total / max(sum(good_per_rank), 1)
        out["losses"].append(float(loss))
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    out["state"] = {k: v.detach().clone() for k, v in acc.get_state_dict(model).items()}
    model.eval()  # a backward through an eval-mode forward is refused
    batch = next(iter(dl))
    loss = model(**batch).logits.float().mean()
    try:
        acc.backward(loss)
    except RuntimeError as e:
        out["eval_backward"] = str(e)
    return out


# -- the launch ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def launched() -> list[dict[str, Any]]:
    return run_distributed(_sequence_parallel_run, world_size=2, timeout=400)


def _forward_error() -> float:
    """A forward's float32 error: the Llama's layers (attention and MLP count two each, the
    head one) add at most max(INTERMEDIATE, VOCAB, SEQ) terms per reduction; the sequence
    split changes the order of the attention's and the loss's sums."""
    return float32_error(2 * LAYERS + 1, terms=max(INTERMEDIATE, VOCAB, SEQ))


def test_each_rank_reads_its_half_of_each_sequence_with_shift_labels(launched):
    whole = samples()
    for rank, result in enumerate(launched):
        assert result["len"] == SAMPLES  # each rank's 2 samples, times the 2 ranks of the group
        assert len(result["slices"]) == SAMPLES
        for step, batch in enumerate(result["slices"]):
            half = slice(rank * SEQ // 2, (rank + 1) * SEQ // 2)
            labels = torch.nn.functional.pad(whole[step]["labels"], (0, 1), value=-100)[1:]
            assert "labels" not in batch
            assert torch.equal(batch["input_ids"][0], whole[step]["input_ids"][half])
            assert torch.equal(batch["position_ids"][0], whole[step]["position_ids"][half])
            assert torch.equal(batch["shift_labels"][0], labels[half])
        assert result["engine"] == "DeepSpeedEngine"
        assert result["train_batch_size"] == 1  # one sample per step: the data-parallel size is 1
        assert result["data_parallel_size"] == 1


def test_the_aggregated_loss_and_the_training_equal_one_process_on_whole_sequences(launched):
    """Step 0's aggregated loss is the whole-sequence loss of the same weights (within a
    forward's rounding); the next steps' losses and the weights after SAMPLES steps are those
    of plain SGD on whole sequences (a step's gradients within a backward's rounding, which
    the global-norm clip scales: see accel_testkit.tolerance)."""
    want = reference()
    forward = _forward_error()
    terms = norm_terms(p for p in want["state"].values())
    step = float32_error(2 * LAYERS + 1, terms=max(INTERMEDIATE, VOCAB, SEQ), norm_terms=terms)
    for result in launched:
        assert abs(result["losses"][0] - want["losses"][0]) <= forward * want["losses"][0]
        assert_same_losses(result["losses"], want["losses"], forward, SAMPLES * step)
        assert_same_training(result["state"], want["state"], want["start"], SAMPLES * step)


def test_a_model_in_eval_mode_is_trained_with_sequence_parallel_and_said_so(launched):
    for result in launched:
        assert result["training_after_prepare"] is True
        assert any("eval mode" in w and "train mode" in w for w in result["warnings"])
        assert "model.train()" in result["eval_backward"]
