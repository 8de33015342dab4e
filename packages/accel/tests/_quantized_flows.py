"""transformers' quantized loading and PEFT's QLoRA with `import accelerate` answered by accel.

    python _quantized_flows.py OUT

Turns the switch on in code, loads a tiny Llama (built from a config, saved to a temporary
folder) with `BitsAndBytesConfig` 8-bit and nf4 and with `TorchAoConfig`, with
`device_map="auto"` (also spilling to disk) and with a hand-written map with a layer on disk,
saves and reloads the quantized models, trains LoRA adapters on the 4-bit model, and writes
what the tests compare under OUT (`torch.save` for tensors, `quantized.json` for numbers). The references are the libraries' own layers
quantizing the same weights, built here without accel.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import accel

accel.use_as_accelerate()

import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    BitsAndBytesConfig,
    LlamaConfig,
    LlamaForCausalLM,
    TorchAoConfig,
)

transformers.logging.set_verbosity_error()
VOCAB = 64
PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
DISK_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}


def tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def torchao_refused() -> str | None:
    """Why transformers takes no torchao quantization here (None: it does). Its TorchAoConfig
    wants a torchao newer than the one built for torch 2.9.0 (CI's torch-2.9 lane)."""
    from importlib.metadata import version

    import transformers
    from transformers.utils import import_utils

    if import_utils.is_torchao_available():
        return None
    wanted = getattr(import_utils, "TORCHAO_MIN_VERSION", "a newer one")
    return (
        f"needs a newer torch: transformers {transformers.__version__}'s TorchAoConfig takes "
        f"torchao >= {wanted}, and torch {torch.__version__} has torchao {version('torchao')} "
        f"(each torchao release is built for one torch)"
    )


def configs() -> dict[str, Any]:
    from torchao.quantization import Int8WeightOnlyConfig

    out = {
        "int8": BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=True),
        "nf4": BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
            llm_int8_enable_fp32_cpu_offload=True,
        ),
    }  # fmt: skip
    if torchao_refused() is None:
        out["torchao"] = TorchAoConfig(Int8WeightOnlyConfig())
    return out


def own(kind: str) -> nn.Module:
    """The library's own quantize-then-run: its layers on the full-precision weights."""
    model = tiny_model()
    keep = "lm_head"
    if kind == "torchao":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(
            model,
            Int8WeightOnlyConfig(),
            filter_fn=lambda m, n: isinstance(m, nn.Linear) and not n.startswith(keep),
        )
        return model
    import bitsandbytes as bnb

    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or name.startswith(keep):
            continue
        if kind == "int8":
            layer = bnb.nn.Linear8bitLt(
                module.in_features, module.out_features, False, has_fp16_weights=False,
                threshold=6.0,
            )  # fmt: skip
        else:
            layer = bnb.nn.Linear4bit(
                module.in_features, module.out_features, False, torch.float32,
                compress_statistics=False, quant_type="nf4",
            )  # fmt: skip
        layer.weight.data = module.weight.data
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, layer.to("cpu"))  # moving quantizes
    return model.eval()


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(PROMPT).logits


def flow_loads(out: Path, work: Path) -> dict[str, Any]:
    saved = work / "tiny"
    full = tiny_model()
    full.save_pretrained(saved)
    tensors: dict[str, torch.Tensor] = {"full": logits(full)}
    result: dict[str, Any] = {"torchao_refused": torchao_refused()}
    for kind, config in configs().items():
        model = AutoModelForCausalLM.from_pretrained(
            saved, quantization_config=config, device_map="auto", dtype=torch.float32
        )
        # saved before its first forward: on CPUs with AVX512-BF16, bitsandbytes repacks 4-bit
        # weights for its kernel there (scales to bf16), and unpacking them to save is lossy
        model.save_pretrained(work / f"saved_{kind}")
        tensors[f"{kind}_auto"] = logits(model)
        tensors[f"{kind}_own"] = logits(own(kind))
        result[f"{kind}_layer"] = type(model.model.layers[0].self_attn.q_proj).__name__
        result[f"{kind}_weight"] = type(model.model.layers[0].self_attn.q_proj.weight).__name__
        reloaded = AutoModelForCausalLM.from_pretrained(work / f"saved_{kind}", device_map="auto")
        tensors[f"{kind}_reloaded"] = logits(reloaded)
        if kind == "torchao":
            continue  # transformers quantizes torchao weights bound for disk on "cuda" only
        # device_map="auto" with a small budget: the decoder layers go to disk. transformers
        # leaves their float32 weights in the checkpoint (the offload index points there), and
        # accel's offload hooks quantize them for each forward, as accelerate's do.
        auto_disk = AutoModelForCausalLM.from_pretrained(
            saved, quantization_config=config, device_map="auto", dtype=torch.float32,
            max_memory={"cpu": 60_000}, offload_folder=str(work / f"offload_auto_{kind}"),
        )  # fmt: skip
        tensors[f"{kind}_auto_disk"] = logits(auto_disk)
        tensors[f"{kind}_auto_disk_again"] = logits(auto_disk)
        result[f"{kind}_auto_disk_map"] = {k: str(v) for k, v in auto_disk.hf_device_map.items()}
        # A hand-written map with a layer on disk: transformers keeps the modules it maps to
        # "cpu" or "disk" unquantized (llm_int8_enable_fp32_cpu_offload), so on a CPU machine
        # this runs the whole model in float32 through accel's offload hooks.
        spilled = AutoModelForCausalLM.from_pretrained(
            saved, quantization_config=config, device_map=DISK_MAP, dtype=torch.float32,
            offload_folder=str(work / f"offload_{kind}"),
        )  # fmt: skip
        tensors[f"{kind}_disk"] = logits(spilled)
        result[f"{kind}_disk_map"] = {k: str(v) for k, v in spilled.hf_device_map.items()}
        result[f"{kind}_disk_layer"] = type(spilled.model.layers[1].self_attn.q_proj).__name__
    torch.save(tensors, out / "quantized_logits.pt")
    return result


def flow_qlora(work: Path) -> dict[str, Any]:
    """PEFT's QLoRA recipe on the nf4 model, trained by accel's Accelerator on a fixed batch."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    saved = work / "tiny_qlora"
    tiny_model().save_pretrained(saved)
    model = AutoModelForCausalLM.from_pretrained(
        saved, quantization_config=configs()["nf4"], device_map="auto", dtype=torch.float32
    )
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"])
    model = get_peft_model(model, lora)
    accelerator = accel.Accelerator(cpu=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = torch.arange(16).remainder(VOCAB).unsqueeze(0).repeat(2, 1)
    losses = []
    for _ in range(8):
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    frozen = [p for p in model.parameters() if type(p).__name__ == "Params4bit"]
    return {
        "losses": losses,
        "frozen_4bit_weights": sum(not p.requires_grad for p in frozen),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        result = flow_loads(out, Path(work))
        result["qlora"] = flow_qlora(Path(work))
    result["accelerate"] = sys.modules["accelerate"].__name__
    result["accelerate_file"] = sys.modules["accelerate"].__file__
    (out / "quantized.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
