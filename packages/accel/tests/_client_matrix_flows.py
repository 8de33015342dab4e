"""The client matrix: transformers, diffusers, TRL, PEFT and lm-eval, each run with their
defaults against `import accelerate`.

    python _client_matrix_flows.py OUT IMPL GROUP[:CELL,...] [GROUP ...]

IMPL is "accel" (the switch turned on in code, or already on from `ACCEL_AS_ACCELERATE=1`)
or "accelerate" (the real accelerate, as the reference). Every cell of every GROUP runs in
this one interpreter; each writes what it saw into `OUT/<group>_<impl>_rank<r>.json`:
`{"cell": {"ok": true, ...facts}}`, or `{"ok": false, "error": ...}` when the client raised.
Tensors the tests compare go in the JSON as lists (the models are tiny) or in `.pt` files.
Nothing is downloaded: every model is built from a config, every tokenizer from a word list.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
IMPL = sys.argv[2] if len(sys.argv) > 2 else "accel"
if IMPL == "accel":
    import accel
    from accel._as_accelerate import is_used_as_accelerate

    if not is_used_as_accelerate():
        accel.use_as_accelerate()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
VOCAB, SEQ = 64, 16
PROMPT = torch.tensor([[1, 2, 3, 4, 5]])
RANK = int(os.environ.get("RANK", "0"))


def tiny_config(tied: bool = False) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def tiny_model(seed: int = 0, tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(tied))


def device_map_of(model: torch.nn.Module) -> dict[str, str] | None:
    found = getattr(model, "hf_device_map", None)
    return None if found is None else {k: str(v) for k, v in found.items()}


def outputs(model: torch.nn.Module) -> dict[str, Any]:
    """Logits of the prompt (float32 lists) and 8 greedy tokens after it."""
    with torch.no_grad():
        logits = model(PROMPT).logits.float()
        generated = model.generate(PROMPT, max_new_tokens=8, do_sample=False, pad_token_id=0)
    return {"logits": logits.flatten().tolist(), "generated": generated[0].tolist()}


# transformers: big-model loading ----------------------------------------------------------------


def group_bigmodel(work: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    saved, tied_saved = work / "tiny", work / "tiny_tied"
    tiny_model(seed=3).save_pretrained(saved)
    tiny_model(seed=4, tied=True).save_pretrained(tied_saved)
    size = sum(p.numel() * 4 for p in tiny_model().parameters())
    budget = size // 2  # about half the model stays on the CPU, the rest goes to disk
    counter = iter(range(1000))

    def load(folder: Path = saved, **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("offload_folder") is True:
            kwargs["offload_folder"] = str(work / f"offload{next(counter)}")
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        dtypes = sorted({str(p.dtype) for p in model.parameters() if not p.is_meta})
        return {"device_map": device_map_of(model), "dtypes": dtypes, **outputs(model)}

    cells: dict[str, Callable[[], dict[str, Any]]] = {
        "plain": lambda: load(),
        "plain_tied": lambda: load(tied_saved),
        "plain_float16": lambda: load(dtype=torch.float16),
        "plain_bfloat16": lambda: load(dtype=torch.bfloat16),
    }
    for strategy in ("auto", "balanced", "balanced_low_0", "sequential"):
        cells[f"{strategy}"] = lambda s=strategy: load(device_map=s)
        for kind, value in (
            ("int", budget),
            ("float", float(budget)),
            ("str", f"{budget / 2**10:.2f}KiB"),
        ):
            cells[f"{strategy}_max_memory_{kind}"] = lambda s=strategy, v=value: load(
                device_map=s, max_memory={"cpu": v}, offload_folder=True
            )
    hand = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "disk",
    }
    cells["hand_map"] = lambda: load(device_map=hand, offload_folder=True)
    cells["hand_map_all_cpu"] = lambda: load(device_map={"": "cpu"})
    cells["auto_float16_disk"] = lambda: load(
        dtype=torch.float16, device_map="auto", max_memory={"cpu": budget // 2}, offload_folder=True
    )
    cells["auto_bfloat16_disk"] = lambda: load(
        dtype=torch.bfloat16,
        device_map="auto",
        max_memory={"cpu": budget // 2},
        offload_folder=True,
    )
    cells["auto_torch_dtype_float16"] = lambda: load(torch_dtype=torch.float16, device_map="auto")
    cells["auto_offload_state_dict"] = lambda: load(
        device_map="auto", max_memory={"cpu": budget}, offload_folder=True, offload_state_dict=True
    )
    cells["auto_low_cpu_mem_usage"] = lambda: load(device_map="auto", low_cpu_mem_usage=True)
    cells["low_cpu_mem_usage_no_map"] = lambda: load(low_cpu_mem_usage=True)
    cells["tied_auto_disk"] = lambda: load(
        tied_saved, device_map="auto", max_memory={"cpu": budget}, offload_folder=True
    )
    cells["tied_sequential"] = lambda: load(tied_saved, device_map="sequential")
    return cells


# PEFT: a LoRA model loaded with device_map="auto" and disk offload --------------------------------


def group_peft(work: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    from peft import LoraConfig, PeftModel, get_peft_model

    saved, adapter = work / "base", work / "adapter"
    tiny_model(seed=5).save_pretrained(saved)
    lora = get_peft_model(
        tiny_model(seed=5),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    lora.save_pretrained(adapter)
    size = sum(p.numel() * 4 for p in tiny_model().parameters())

    def run(**kwargs: Any) -> dict[str, Any]:
        base = AutoModelForCausalLM.from_pretrained(saved, **kwargs)
        model = PeftModel.from_pretrained(base, adapter)
        lora_out = outputs(model)
        merged = model.merge_and_unload()
        return {
            "device_map": device_map_of(base),
            "lora": lora_out,
            "merged": outputs(merged),
            "merged_has_lora": any("lora_" in n for n, _ in merged.named_modules()),
        }

    return {
        "lora_plain": lambda: run(),
        "lora_auto": lambda: run(device_map="auto"),
        "lora_auto_disk": lambda: run(
            device_map="auto", max_memory={"cpu": size // 2}, offload_folder=str(work / "off")
        ),
    }


# diffusers: loading, both offloads, a training loop in the style of its examples ----------------


def tiny_sd(work: Path) -> Any:
    """A Stable Diffusion pipeline of tiny random parts (UNet, VAE, CLIP text encoder, a word
    tokenizer)."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    words = ["a", "cat", "dog", "photo", "of", "the"]
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for word in words:
        vocab[word] = len(vocab)
        vocab[f"{word}</w>"] = len(vocab)
    (work / "vocab.json").write_text(json.dumps(vocab))
    (work / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        str(work / "vocab.json"), str(work / "merges.txt"), model_max_length=8
    )
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(8, 16), norm_num_groups=4, cross_attention_dim=16,
        attention_head_dim=2,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )  # fmt: skip
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
        norm_num_groups=4, layers_per_block=1, sample_size=16,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
    )  # fmt: skip
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_attention_heads=2,
            num_hidden_layers=2, max_position_embeddings=8, bos_token_id=0, eos_token_id=1,
            pad_token_id=1,
        )
    )  # fmt: skip
    return StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text, tokenizer=tokenizer, scheduler=DDIMScheduler(),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip


def images(pipe: Any) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        out = pipe("a photo of a cat", num_inference_steps=2, height=16, width=16,
                   generator=generator, output_type="np")  # fmt: skip
    return out.images.flatten().tolist()


def group_diffusers(work: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    from diffusers import StableDiffusionPipeline

    saved = work / "sd"
    pipe = tiny_sd(work)
    pipe.save_pretrained(saved)
    reference = images(pipe)

    def load(low_cpu_mem_usage: bool) -> dict[str, Any]:
        loaded = StableDiffusionPipeline.from_pretrained(saved, low_cpu_mem_usage=low_cpu_mem_usage)
        meta = [n for n, p in loaded.unet.named_parameters() if p.is_meta]
        return {"same_images": images(loaded) == reference, "meta_params": meta}

    def offload(kind: str, device: str | None) -> dict[str, Any]:
        loaded = StableDiffusionPipeline.from_pretrained(saved)
        method = getattr(loaded, f"enable_{kind}_cpu_offload")
        method() if device is None else method(device=device)
        hooked = sorted(n for n in ("unet", "vae", "text_encoder")
                        if hasattr(getattr(loaded, n), "_hf_hook"))  # fmt: skip
        meta = sum(p.is_meta for p in loaded.unet.parameters())
        first, second = images(loaded), images(loaded)
        return {"same_images": first == reference, "same_again": second == reference,
                "hooked": hooked, "unet_meta_params": meta}  # fmt: skip

    return {
        "load_low_cpu_mem_usage": lambda: load(True),
        "load_no_low_cpu_mem_usage": lambda: load(False),
        "model_cpu_offload_cpu": lambda: offload("model", "cpu"),
        "sequential_cpu_offload_cpu": lambda: offload("sequential", "cpu"),
        "model_cpu_offload_default": lambda: offload("model", None),
        "sequential_cpu_offload_default": lambda: offload("sequential", None),
        "train_resume": lambda: diffusers_training(work),
    }


def diffusers_training(work: Path) -> dict[str, Any]:
    """A UNet trained as diffusers' example scripts do: gradient accumulation, an EMA copy
    saved and loaded by `save_state`/`load_state` pre-hooks. Saved after 2 optimizer steps,
    resumed into fresh objects, it reaches the weights (and EMA) of the uninterrupted run."""
    from accelerate import Accelerator
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.training_utils import EMAModel

    data = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    noise_scheduler = DDPMScheduler(num_train_timesteps=50)
    config = dict(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), norm_num_groups=4,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    )  # fmt: skip
    checkpoint = work / "train" / "checkpoint-2"

    def run(seed: int, resume: bool) -> tuple[dict, dict, list[float]]:
        accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
        torch.manual_seed(seed)
        unet = UNet2DModel(**config)
        ema = EMAModel(unet.parameters(), decay=0.9, model_cls=UNet2DModel,
                       model_config=unet.config)  # fmt: skip

        def save_hook(models: list, weights: list, output_dir: str) -> None:
            if accelerator.is_main_process:
                ema.save_pretrained(os.path.join(output_dir, "unet_ema"))
                for model in models:
                    model.save_pretrained(os.path.join(output_dir, "unet"))
                    weights.pop()  # saved above: save_state must not save it again

        def load_hook(models: list, input_dir: str) -> None:
            loaded_ema = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"), UNet2DModel)
            ema.load_state_dict(loaded_ema.state_dict())
            while models:
                model = models.pop()
                loaded = UNet2DModel.from_pretrained(input_dir, subfolder="unet")
                model.register_to_config(**loaded.config)
                model.load_state_dict(loaded.state_dict())

        accelerator.register_save_state_pre_hook(save_hook)
        accelerator.register_load_state_pre_hook(load_hook)
        optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(data, batch_size=2)
        unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)
        step, losses = 0, []
        if resume:
            accelerator.load_state(str(checkpoint))
            step = 2
        for index, batch in enumerate(loader):
            if index < 2 * step:
                continue
            generator = torch.Generator().manual_seed(index)
            noise = torch.randn(batch.shape, generator=generator)
            timesteps = torch.randint(0, 50, (batch.shape[0],), generator=generator)
            noisy = noise_scheduler.add_noise(batch, noise, timesteps)
            with accelerator.accumulate(unet):
                loss = torch.nn.functional.mse_loss(unet(noisy, timesteps).sample, noise)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
            if accelerator.sync_gradients:
                ema.step(unet.parameters())
                step += 1
                if step == 2 and not resume:
                    accelerator.save_state(str(checkpoint))
        weights = {k: v.clone() for k, v in accelerator.unwrap_model(unet).state_dict().items()}
        shadow = {str(i): p.clone() for i, p in enumerate(ema.shadow_params)}
        return weights, shadow, losses

    full, full_ema, losses = run(0, resume=False)
    files = sorted(p.name for p in checkpoint.iterdir())
    resumed, resumed_ema, _ = run(1, resume=True)
    return {
        "steps": len(losses) // 2,
        "checkpoint_files": files,
        "same_weights": all(torch.equal(full[k], resumed[k]) for k in full),
        "same_ema": all(torch.equal(full_ema[k], resumed_ema[k]) for k in full_ema),
        "ema_differs_from_weights": any(
            not torch.equal(a, b) for a, b in zip(full_ema.values(), full.values())
        ),
    }


# TRL: SFTTrainer and DPOTrainer, and TRL's own imports from accelerate ---------------------------

WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over VOCAB ids: <pad>, <s>, </s>, <unk>, then w0, w1, ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}{% endif %}"
    )
    return tokenizer


def counting_text(n: int, length: int, seed: int = 1) -> list[str]:
    """Sentences that count up through the words from a random start: easy to learn."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(WORDS), (n,), generator=gen).tolist()
    return [" ".join(WORDS[(s + j) % len(WORDS)] for j in range(length)) for s in starts]


def trl_common(out: str, **extra: Any) -> dict[str, Any]:
    return dict(
        output_dir=out, max_steps=4, per_device_train_batch_size=2, learning_rate=5e-3,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True,  # TRL's configs default to bf16, which transformers allows on a CPU only so
        disable_tqdm=True, seed=0, **extra,
    )  # fmt: skip


def losses_of(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def group_trl(work: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    def sft() -> dict[str, Any]:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        data = Dataset.from_dict({"text": counting_text(16, 12)})
        trainer = SFTTrainer(
            model=tiny_model(seed=11),
            args=SFTConfig(**trl_common(str(work / "sft"), max_length=16)),
            train_dataset=data,
            processing_class=tiny_tokenizer(),
        )
        trainer.train()
        return {"losses": losses_of(trainer), "accelerator": type(trainer.accelerator).__module__}

    def dpo() -> dict[str, Any]:
        from accelerate import PartialState
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

        text = counting_text(16, 12, seed=2)
        wrong = counting_text(16, 6, seed=3)
        data = Dataset.from_dict({
            "prompt": [t[: t.index(" ", 10)] for t in text],
            "chosen": [t[t.index(" ", 10):] for t in text],
            "rejected": [" " + w for w in wrong],
        })  # fmt: skip
        # DPOTrainer loads its reference model by name. Under a launch transformers writes
        # on rank 0 only, so the folder is OUT, which every rank sees.
        saved = Path(sys.argv[1]) / f"dpo_model_{IMPL}"
        tiny_model(seed=12).save_pretrained(saved)
        PartialState().wait_for_everyone()
        trainer = DPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(saved),
            args=DPOConfig(**trl_common(str(work / "dpo"), max_length=24, beta=0.1)),
            train_dataset=data,
            processing_class=tiny_tokenizer(),
        )
        trainer.train()
        log = trainer.state.log_history
        margins = [e["rewards/margins"] for e in log if "rewards/margins" in e]
        return {"losses": losses_of(trainer), "margins": margins,
                "accelerator": type(trainer.accelerator).__module__}  # fmt: skip

    def imports() -> dict[str, Any]:
        import importlib
        import pkgutil

        import trl

        failed, imported = {}, []
        for info in pkgutil.walk_packages(trl.__path__, "trl."):
            spec = importlib.util.find_spec(info.name)
            source = Path(spec.origin).read_text() if spec and spec.origin else ""
            if "accelerate" not in source or spec.origin.endswith("__main__.py"):
                continue
            try:
                importlib.import_module(info.name)
                imported.append(info.name)
            except Exception as error:
                failed[info.name] = f"{type(error).__name__}: {error}"
        return {"imported": imported, "failed": failed}

    def utilities() -> dict[str, Any]:
        from accelerate import PartialState
        from accelerate.utils import (
            broadcast_object_list,
            gather,
            gather_object,
            is_deepspeed_available,
            is_peft_model,
            set_seed,
        )
        from peft import LoraConfig, get_peft_model

        state = PartialState()
        set_seed(3)
        drawn = torch.rand(2).tolist()
        set_seed(3)
        objects = [{"rank": state.process_index}]
        return {
            "gathered": gather_object([state.process_index]),
            "gathered_tensor": gather(torch.tensor([state.process_index])).tolist(),
            "broadcast": broadcast_object_list(objects)[0],
            "deepspeed_available": bool(is_deepspeed_available()),
            "seeded": torch.rand(2).tolist() == drawn,
            "peft": is_peft_model(
                get_peft_model(tiny_model(), LoraConfig(target_modules=["q_proj"]))
            ),
            "not_peft": is_peft_model(tiny_model()),
            "num_processes": state.num_processes,
        }

    return {"sft": sft, "dpo": dpo, "imports": imports, "utilities": utilities}


# lm-eval: HFLM on a tiny local model and a local task ---------------------------------------------


def lm_eval_files(work: Path) -> tuple[Path, Path]:
    """A saved tiny model with its tokenizer, and a folder holding a local multiple-choice task
    (its data in a JSON-lines file: nothing to download). Under a launch rank 0 writes them in
    OUT, which every rank sees (transformers saves on rank 0 only)."""
    from accelerate import PartialState

    state = PartialState()
    shared = Path(sys.argv[1]) / f"lm_eval_files_{IMPL}"
    model_dir, task_dir = shared / "lm", shared / "tasks"
    if state.is_main_process:
        tiny_model(seed=21).save_pretrained(model_dir)
        tiny_tokenizer().save_pretrained(model_dir)
        task_dir.mkdir(parents=True, exist_ok=True)
        rows = []
        for i, text in enumerate(counting_text(12, 6, seed=4)):
            words = text.split()
            wrong = WORDS[(WORDS.index(words[-1]) + 7) % len(WORDS)]
            choices = [words[-1], wrong] if i % 2 else [wrong, words[-1]]
            rows.append({"prompt": " ".join(words[:-1]), "choices": choices, "label": i % 2 ^ 1})
        data = task_dir / "count.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (task_dir / "count.yaml").write_text(
            "task: accel_count\n"
            "dataset_path: json\n"
            f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
            "test_split: test\n"
            "output_type: multiple_choice\n"
            "doc_to_text: '{{prompt}}'\n"
            "doc_to_choice: '{{choices}}'\n"
            "doc_to_target: '{{label}}'\n"
            "target_delimiter: ' '\n"
            "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
        )
    state.wait_for_everyone()
    return model_dir, task_dir


def lm_eval_scores(model_dir: Path, task_dir: Path) -> dict[str, Any]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=str(model_dir), device="cpu", batch_size=4, dtype="float32")
    results = simple_evaluate(
        model=lm, tasks=["accel_count"], task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
    )  # fmt: skip
    if results is None:  # every rank but 0
        return {"rank": lm.rank, "world_size": lm.world_size}
    samples = results["samples"]["accel_count"]
    return {
        "rank": lm.rank,
        "world_size": lm.world_size,
        "scores": {k: v for k, v in results["results"]["accel_count"].items() if "," in k},
        "loglikelihoods": {str(s["doc_id"]): [float(r[0][0]) for r in s["resps"]] for s in samples},
    }


def group_lm_eval(work: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    model_dir, task_dir = lm_eval_files(work)
    return {"hflm": lambda: lm_eval_scores(model_dir, task_dir)}


# transformers: Trainer options --------------------------------------------------------------------


class Counting(torch.utils.data.Dataset):
    """Sequences that count up from a random start (mod VOCAB): easy to learn."""

    def __init__(self, n: int, seed: int = 1) -> None:
        start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (start + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def group_trainer(work: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    from transformers import Trainer, TrainingArguments

    counter = iter(range(1000))

    def train(evaluate: bool = False, **overrides: Any) -> dict[str, Any]:
        out = work / f"run{next(counter)}"
        kwargs: dict[str, Any] = dict(
            output_dir=str(out), per_device_train_batch_size=4, per_device_eval_batch_size=4,
            max_steps=4, learning_rate=5e-3, lr_scheduler_type="constant", logging_steps=1,
            save_strategy="no", report_to=[], disable_tqdm=True, seed=0,
        )  # fmt: skip
        kwargs.update(overrides)
        trainer = Trainer(
            model=tiny_model(seed=31),
            args=TrainingArguments(**kwargs),
            train_dataset=Counting(32),
            eval_dataset=Counting(8, seed=2),
        )
        trainer.train()
        found: dict[str, Any] = {
            "losses": losses_of(trainer),
            "tokens_seen": int(getattr(trainer.state, "num_input_tokens_seen", 0) or 0),
            "batch_size": trainer._train_batch_size,
            "best": trainer.state.best_model_checkpoint,
            "checkpoints": sorted(
                p.name for p in out.glob("checkpoint-*")
            ),
            "checkpoint_files": sorted(
                f.name for f in next(iter(sorted(out.glob("checkpoint-*"))), out).iterdir()
            ) if list(out.glob("checkpoint-*")) else [],
            "weights": {k: v.float().sum().item() for k, v in trainer.model.state_dict().items()},
        }  # fmt: skip
        if evaluate:
            found["eval_loss"] = trainer.evaluate()["eval_loss"]
        return found

    def ac(**options: Any) -> dict[str, Any]:
        return train(accelerator_config=options)

    return {
        "baseline": lambda: train(evaluate=True),
        "split_batches": lambda: ac(split_batches=True),
        "dispatch_batches": lambda: ac(dispatch_batches=True),
        "dispatch_batches_false": lambda: ac(dispatch_batches=False),
        "even_batches_false": lambda: ac(even_batches=False),
        "use_seedable_sampler_false": lambda: ac(use_seedable_sampler=False),
        "non_blocking": lambda: ac(non_blocking=True),
        "gradient_accumulation_kwargs": lambda: train(
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}},
        ),
        "gradient_accumulation": lambda: train(
            per_device_train_batch_size=2, gradient_accumulation_steps=2
        ),
        "gradient_checkpointing": lambda: train(gradient_checkpointing=True),
        "torch_compile_eager": lambda: train(torch_compile=True, torch_compile_backend="eager"),
        "auto_find_batch_size": lambda: train(auto_find_batch_size=True),
        "include_num_input_tokens_seen": lambda: train(include_num_input_tokens_seen=True),
        "dataloader_num_workers": lambda: train(dataloader_num_workers=1),
        "save_only_model": lambda: train(save_strategy="steps", save_steps=2, save_only_model=True),
        "load_best_model_at_end": lambda: train(
            eval_strategy="steps",
            eval_steps=1,
            save_strategy="steps",
            save_steps=1,
            save_total_limit=1,
            load_best_model_at_end=True,
            metric_for_best_model="loss",
        ),
        "eval_accumulation_steps": lambda: train(evaluate=True, eval_accumulation_steps=1),
        "bf16_cpu": lambda: train(bf16=True, use_cpu=True),  # transformers asks use_cpu for it
    }


GROUPS = {
    "bigmodel": group_bigmodel,
    "peft": group_peft,
    "diffusers": group_diffusers,
    "trl": group_trl,
    "lm_eval": group_lm_eval,
    "trainer": group_trainer,
}


def run_group(name: str, out: Path, only: list[str]) -> None:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        cells = GROUPS[name](Path(work))
        for cell, body in cells.items():
            if only and cell not in only:
                continue
            try:
                start = time.perf_counter()
                results[cell] = {"ok": True, **body()}
                results[cell]["seconds"] = round(time.perf_counter() - start, 2)
            except Exception as error:  # a client that raises is a result of its cell
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                    raise  # one rank going on alone would leave the others waiting
                results[cell] = {
                    "ok": False,
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()[-3000:],
                }
    results["_meta"] = {"accelerate": getattr(sys.modules.get("accelerate"), "__file__", None)}
    (out / f"{name}_{IMPL}_rank{RANK}.json").write_text(json.dumps(results))


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for spec in argv[2:]:  # GROUP, or GROUP:CELL,CELL to run only those cells
        name, _, cells = spec.partition(":")
        run_group(name, out, [c for c in cells.split(",") if c])
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
