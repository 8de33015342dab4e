"""transformers' and PEFT's own flows with `import accelerate` answered by accel.

    python _client_flows.py OUT FLOW [FLOW ...]

Turns the switch on in code (`accel.use_as_accelerate()`) unless the environment already did
(`ACCEL_AS_ACCELERATE=1`, as `accel launch --as_accelerate` sets), runs each FLOW, and writes
what the tests compare under OUT: tensors with `torch.save`, numbers in `<flow>.json`. Models
are tiny Llamas built from a config; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import accel
from accel._as_accelerate import is_used_as_accelerate

SWITCHED_BY_ENV = is_used_as_accelerate()
if not SWITCHED_BY_ENV:
    accel.use_as_accelerate()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)

transformers.logging.set_verbosity_error()
VOCAB, SEQ = 64, 16


def tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config())


class Counting(torch.utils.data.Dataset):
    """Sequences that count up from a random start (mod VOCAB): easy to learn, so loss falls."""

    def __init__(self, n: int, seed: int = 1) -> None:
        start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (start + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train_args(out: Path, **overrides: Any) -> TrainingArguments:
    kwargs: dict[str, Any] = {
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "max_steps": 8,
        "learning_rate": 5e-3,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    kwargs.update(overrides)
    return TrainingArguments(str(out), **kwargs)


def losses(trainer: Trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def flow_trainer(out: Path, work: Path) -> dict[str, Any]:
    """Trainer.train / evaluate / gradient accumulation / resume_from_checkpoint, 1 process."""
    # 10 held-out samples in batches of 4: the last batch is short, as in most datasets.
    data, held_out = Counting(32), Counting(10, seed=2)
    full = Trainer(
        model=tiny_model(),
        args=train_args(work / "full", save_strategy="steps", save_steps=4),
        train_dataset=data,
    )
    full.train()
    torch.save(state(full.model), out / "trainer_full.pt")
    metrics = full.evaluate(held_out)
    # Evaluation by hand, in plain torch: Trainer gives each sample its batch's mean loss
    # and averages over the samples (batches of 4, 4 and 2).
    full.model.eval()
    device = next(full.model.parameters()).device
    with torch.no_grad():
        by_hand = [
            full.model(input_ids=ids, labels=ids).loss.cpu() * len(ids)
            for ids in held_out.ids.to(device).split(4)
        ]
    resumed = Trainer(
        model=tiny_model(seed=7),  # different init: everything must come from the checkpoint
        args=train_args(work / "full"),
        train_dataset=data,
    )
    resumed.train(resume_from_checkpoint=str(work / "full" / "checkpoint-4"))
    torch.save(state(resumed.model), out / "trainer_resumed.pt")
    # Gradient accumulation against the whole batch, with SGD and no clipping: a step is
    # linear in the gradient, so the runs differ by float32 rounding alone (test_clients
    # bounds it). With AdamW a gradient that is zero up to rounding can move a weight by
    # +-lr, by an amount that depends on the CPU's kernels; with clipping a wrong scale of
    # the accumulated gradient would be clipped away unseen.
    sgd = {"optim": "sgd", "learning_rate": 5e-2, "max_grad_norm": 0.0, "max_steps": 4}
    whole = Trainer(model=tiny_model(), args=train_args(work / "sgd", **sgd), train_dataset=data)
    whole.train()
    torch.save(state(whole.model), out / "trainer_sgd_whole.pt")
    accumulated = Trainer(
        model=tiny_model(),
        args=train_args(
            work / "ga", per_device_train_batch_size=2, gradient_accumulation_steps=2, **sgd
        ),
        train_dataset=data,
    )
    accumulated.train()
    torch.save(state(accumulated.model), out / "trainer_ga.pt")
    torch.save(state(tiny_model()), out / "trainer_start.pt")
    at_step_4 = LlamaForCausalLM.from_pretrained(work / "full" / "checkpoint-4")
    torch.save(state(at_step_4), out / "trainer_step4.pt")
    return {
        "losses": losses(full),
        "eval_loss": metrics["eval_loss"],
        "eval_loss_by_hand": float(torch.stack(by_hand).sum() / len(held_out)),
        "accelerator": type(full.accelerator).__module__,
        "ga_steps": accumulated.state.global_step,
    }


def flow_trainer_ddp(out: Path, work: Path) -> dict[str, Any]:
    """Trainer.train on every process of the launch; each rank writes its final weights."""
    trainer = Trainer(
        model=tiny_model(),
        args=train_args(work, per_device_train_batch_size=2, max_steps=8),
        train_dataset=Counting(32),
    )
    trainer.train()
    rank = trainer.args.process_index
    torch.save(state(trainer.model), out / f"ddp_rank{rank}.pt")
    import accelerate

    return {
        "rank": rank,
        "world_size": trainer.args.world_size,
        "losses": losses(trainer),
        "distributed_type": str(trainer.accelerator.distributed_type),
        "accelerate_file": accelerate.__file__,
        "accelerate_version": accelerate.__version__,
        "switched_by_env": SWITCHED_BY_ENV,
    }


def flow_trainer_fsdp(out: Path, work: Path) -> dict[str, Any]:
    """Trainer with FSDP2 settings on every process of the launch, checkpointing at step 4;
    saves the model, which rank 0 reloads with from_pretrained; then a second Trainer resumes
    from the step-4 checkpoint."""
    fsdp_config = {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    work = out / "fsdp_work"  # one folder for every rank: the checkpoint is shared
    settings = {"per_device_train_batch_size": 2, "fsdp": "full_shard", "fsdp_config": fsdp_config}
    trainer = Trainer(
        model=tiny_model(),
        args=train_args(work / "run", save_strategy="steps", save_steps=4, **settings),
        train_dataset=Counting(32),
    )
    trainer.train()
    saved = out / "fsdp_model"
    trainer.save_model(str(saved))
    full = trainer.accelerator.get_state_dict(trainer.model)
    rank = trainer.args.process_index
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in full.items()}, out / "fsdp_full.pt")
        reloaded = LlamaForCausalLM.from_pretrained(saved)
        torch.save(state(reloaded), out / "fsdp_reloaded.pt")
    resumed = Trainer(
        model=tiny_model(seed=7),
        args=train_args(work / "run", **settings),
        train_dataset=Counting(32),
    )
    resumed.train(resume_from_checkpoint=str(work / "run" / "checkpoint-4"))
    again = resumed.accelerator.get_state_dict(resumed.model)
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in again.items()}, out / "fsdp_resumed.pt")
    return {
        "rank": rank,
        "losses": losses(trainer),
        "checkpoint_files": sorted(p.name for p in (work / "run" / "checkpoint-4").iterdir()),
        "is_fsdp": trainer.is_fsdp_enabled,
        "strategy": type(trainer.accelerator.strategy).__name__,
    }


def flow_trainer_deepspeed(out: Path, work: Path) -> dict[str, Any]:
    """Trainer with a DeepSpeed ZeRO-2 config on every process of the launch; saves the model,
    which rank 0 reloads with from_pretrained."""
    config = {
        "zero_optimization": {"stage": 2},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    work = out / "ds_work"
    trainer = Trainer(
        model=tiny_model(),
        args=train_args(work / "run", per_device_train_batch_size=2, deepspeed=config),
        train_dataset=Counting(32),
    )
    trainer.train()
    saved = out / "ds_model"
    trainer.save_model(str(saved))
    rank = trainer.args.process_index
    full = trainer.accelerator.get_state_dict(trainer.deepspeed)
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in full.items()}, out / "ds_full.pt")
        reloaded = LlamaForCausalLM.from_pretrained(saved)
        torch.save(state(reloaded), out / "ds_reloaded.pt")
    return {
        "rank": rank,
        "losses": losses(trainer),
        "is_deepspeed": trainer.is_deepspeed_enabled,
        "strategy": type(trainer.accelerator.strategy).__name__,
    }


def _generate(model: torch.nn.Module, prompt: torch.Tensor) -> torch.Tensor:
    return model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)


def flow_bigmodel(out: Path, work: Path) -> dict[str, Any]:
    """from_pretrained(device_map="auto") spilling to disk, a hand-written map with a layer on
    "disk", and the big-model recipe (init_empty_weights + load_checkpoint_and_dispatch)."""
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch

    saved = work / "tiny"
    tiny_model(seed=3).save_pretrained(saved)
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    results: dict[str, Any] = {}

    def record(tag: str, model: torch.nn.Module) -> None:
        with torch.no_grad():
            torch.save(
                {"logits": model(prompt).logits, "generated": _generate(model, prompt)},
                out / f"bigmodel_{tag}.pt",
            )
        results[tag] = {k: str(v) for k, v in (getattr(model, "hf_device_map", None) or {}).items()}

    record("plain", AutoModelForCausalLM.from_pretrained(saved))
    # The most common call: no max_memory, so transformers measures memory itself and hands
    # accel byte counts as floats.
    record("auto", AutoModelForCausalLM.from_pretrained(saved, device_map="auto"))
    record(
        "auto_disk",
        AutoModelForCausalLM.from_pretrained(
            saved,
            device_map="auto",
            max_memory={"cpu": "60KB"},
            offload_folder=str(work / "offload_auto"),
        ),
    )
    hand = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "disk",
    }
    record(
        "hand_disk",
        AutoModelForCausalLM.from_pretrained(
            saved, device_map=hand, offload_folder=str(work / "offload_hand")
        ),
    )
    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(tiny_config())
    empty.tie_weights()
    results["recipe_meta_before"] = all(p.is_meta for p in empty.parameters())
    model = load_checkpoint_and_dispatch(
        empty,
        str(saved),
        device_map="auto",
        max_memory={"cpu": "60KB"},
        offload_folder=str(work / "offload_recipe"),
        no_split_module_classes=empty._no_split_modules,
    )
    results["recipe_map"] = {k: str(v) for k, v in model.hf_device_map.items()}
    with torch.no_grad():
        torch.save({"logits": model(prompt).logits}, out / "bigmodel_recipe.pt")
    return results


def flow_peft(out: Path, work: Path) -> dict[str, Any]:
    """LoRA on the tiny model, trained with Trainer; the adapter saved and loaded back."""
    from peft import LoraConfig, PeftModel, get_peft_model

    base = tiny_model(seed=5)
    before = state(base)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    trainer = Trainer(
        model=model,
        args=train_args(work / "lora", learning_rate=2e-2, max_steps=8),
        train_dataset=Counting(32),
    )
    trainer.train()
    model.save_pretrained(work / "adapter")
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    model.eval()
    reloaded = PeftModel.from_pretrained(tiny_model(seed=5), work / "adapter").eval()
    with torch.no_grad():
        torch.save(
            {
                "trained": model(input_ids=prompt).logits,
                "reloaded": reloaded(input_ids=prompt).logits,
            },
            out / "peft_logits.pt",
        )
    base_after = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v
        for k, v in state(model).items()
        if "lora_" not in k
    }
    torch.save({"before": before, "after": base_after}, out / "peft_base.pt")
    return {
        "losses": losses(trainer),
        "lora_nonzero_b": sum(
            int(p.abs().sum() > 0) for n, p in model.named_parameters() if "lora_B" in n
        ),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


FLOWS = {
    "trainer": flow_trainer,
    "trainer_ddp": flow_trainer_ddp,
    "trainer_fsdp": flow_trainer_fsdp,
    "trainer_deepspeed": flow_trainer_deepspeed,
    "bigmodel": flow_bigmodel,
    "peft": flow_peft,
}


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[1:]:
        with tempfile.TemporaryDirectory() as work:
            result = FLOWS[name](out, Path(work))
        rank = os.environ.get("RANK", "0")
        (out / f"{name}_rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
