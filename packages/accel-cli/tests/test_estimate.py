"""`accel estimate-memory`: the same figures from a config.json, safetensors headers and a
factory, checked against a real module's parameters."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from accel_cli._estimate import per_process
from accel_cli._model_shapes import layer_of
from accel_cli.main import main

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}

# A module with Llama's parameter names and shapes (grouped-query attention, SwiGLU, RMSNorm
# weights, untied head), so its true parameter count checks the config formula.
TINY_LLAMA = """\
import torch
from torch import nn

H, I, L, HEADS, KV, V = 32, 64, 4, 4, 2, 128
D = H // HEADS


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(H, HEADS * D, bias=False)
        self.k_proj = nn.Linear(H, KV * D, bias=False)
        self.v_proj = nn.Linear(H, KV * D, bias=False)
        self.o_proj = nn.Linear(HEADS * D, H, bias=False)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()
        self.mlp = Mlp()
        self.input_layernorm = nn.RMSNorm(H)
        self.post_attention_layernorm = nn.RMSNorm(H)


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList(Block() for _ in range(L))
        self.norm = nn.RMSNorm(H)


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()
        self.lm_head = nn.Linear(H, V, bias=False)


def build():
    return TinyLlama()
"""


@pytest.fixture
def tiny(tmp_path):
    """The module file, the true parameter count, and a folder with config.json."""
    source = tmp_path / "tiny_llama.py"
    source.write_text(TINY_LLAMA)
    spec = importlib.util.spec_from_file_location("tiny_llama", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return source, model, folder


def report(capsys, *argv):
    assert main(["estimate-memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def check_figures(rep, true_params):
    rows = rep["dtypes"]
    assert rep["parameters"] == true_params
    assert rows["float32"]["total_bytes"] == 4 * true_params
    assert rows["float16"]["total_bytes"] * 2 == rows["float32"]["total_bytes"]
    assert rows["int8"]["total_bytes"] * 4 == rows["float32"]["total_bytes"]
    assert rows["int4"]["total_bytes"] * 8 == rows["float32"]["total_bytes"]
    assert rows["float32"]["training_adam_bytes"] == 16 * true_params
    assert rows["int8"]["training_adam_bytes"] is None
    per = rep["per_process"]
    assert per["num_processes"] == 2
    for dtype in ("float32", "bfloat16"):
        ddp, fsdp2 = per[dtype]["DDP"], per[dtype]["FSDP2"]
        assert 0.5 * ddp < fsdp2 < 0.65 * ddp  # half, plus one gathered layer
        assert ddp > per[dtype]["ZeRO-1"] > per[dtype]["ZeRO-2"] > per[dtype]["ZeRO-3"]


def test_config_json_counts_the_true_parameters(tiny, capsys):
    _, model, folder = tiny
    true_params = sum(p.numel() for p in model.parameters())
    rep = report(capsys, str(folder), "--num_processes", "2")
    check_figures(rep, true_params)
    sizes: dict[str, int] = {}
    for name, param in model.named_parameters():
        sizes[layer_of(name)] = sizes.get(layer_of(name), 0) + param.numel()
    assert rep["largest_layer"]["parameters"] == max(sizes.values())
    assert rep["largest_layer"]["name"].startswith("model.layers.")  # a decoder block
    act = rep["activations"]
    assert act["batch_size"] == 1 and act["seq_len"] == 2048 and "fused attention" in act["method"]
    double = report(capsys, str(folder), "--batch_size", "2", "--seq_len", "2048")
    assert double["activations"]["float32_bytes"] == 2 * act["float32_bytes"]
    assert act["bfloat16_bytes"] < act["float32_bytes"]


@pytest.mark.needs("accel_bigmodel")
def test_safetensors_file_and_shards_read_only_headers(tiny, tmp_path, capsys):
    from safetensors.torch import save_file

    _, model, _ = tiny
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    true_params = sum(v.numel() for v in state.values())
    single = tmp_path / "model.safetensors"
    save_file(state, single)
    rep = report(capsys, str(single), "--num_processes", "2")
    check_figures(rep, true_params)
    assert rep["stored"] == {"bytes": 4 * true_params, "dtypes": ["F32"]}
    assert rep["activations"] is None and any("config.json" in n for n in rep["notes"])

    shards = tmp_path / "sharded"
    shards.mkdir()
    names = sorted(state)
    half = {k: state[k].half() for k in names[: len(names) // 2]}
    rest = {k: state[k].half() for k in names[len(names) // 2 :]}
    save_file(half, shards / "model-00001-of-00002.safetensors")
    save_file(rest, shards / "model-00002-of-00002.safetensors")
    weight_map = {k: "model-00001-of-00002.safetensors" for k in half}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in rest})
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (shards / "config.json").write_text(json.dumps(CONFIG))
    rep = report(capsys, str(shards), "--num_processes", "2")
    check_figures(rep, true_params)  # counted in elements, whatever the stored dtype
    assert rep["stored"] == {"bytes": 2 * true_params, "dtypes": ["F16"]}
    assert rep["activations"] is not None  # the config.json beside the shards gives the shape


@pytest.mark.needs("safetensors")
def test_safetensors_sources_need_accel_bigmodel_and_say_so(tmp_path, capsys, monkeypatch):
    """The headers are read by accel-bigmodel's parser, imported only for such a source."""
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2, 3)}, tmp_path / "model.safetensors")
    monkeypatch.setitem(sys.modules, "accel_bigmodel", None)  # as if it were not installed
    assert main(["estimate-memory", str(tmp_path / "model.safetensors")]) == 2
    assert "needs accel-bigmodel" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    rep = report(capsys, str(tmp_path / "config.json"))  # the hint's alternative works without
    assert rep["method"] == "counted from config.json (llama)"


def test_factory_builds_on_the_meta_device(tiny, capsys):
    source, model, _ = tiny
    rep = report(capsys, f"{source}:build", "--num_processes", "2")
    check_figures(rep, sum(p.numel() for p in model.parameters()))
    assert rep["method"] == "built by the factory on the meta device"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # Published parameter counts of well-known checkpoints.
        (
            {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
             "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512,
             "type_vocab_size": 2, "num_attention_heads": 12},
            109_482_240,  # bert-base-uncased
        ),
        (
            {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
             "vocab_size": 50257, "n_positions": 1024},
            124_439_808,  # gpt2
        ),
        (
            {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
             "intermediate_size": 11008, "vocab_size": 32000, "num_attention_heads": 32},
            6_738_415_616,  # Llama-2-7b
        ),
        (
            {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
             "intermediate_size": 14336, "vocab_size": 32000, "num_attention_heads": 32,
             "num_key_value_heads": 8},
            7_241_732_096,  # Mistral-7B-v0.1
        ),
    ],
)  # fmt: skip
def test_known_model_sizes(tmp_path, capsys, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert report(capsys, str(tmp_path))["parameters"] == expected


def test_table_output_and_errors(tiny, tmp_path, capsys, monkeypatch):
    _, _, folder = tiny
    assert main(["estimate-memory", str(folder), "--num_processes", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("dtype"))
    assert lines[header + 2].startswith("float32") and "177.12 KiB" in lines[header + 2]
    widths = {len(line) for line in lines[header : header + 6]}
    assert len(widths) == 1  # aligned columns
    assert "Training per process on 2 processes" in out and "FSDP2" in out
    assert "Activations estimated per layer and token" in out

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["estimate-memory", "meta-llama/Llama-2-7b-hf"]) == 2
    assert "estimate-memory works offline" in capsys.readouterr().err
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "xlnet"}')
    if importlib.util.find_spec("transformers") is None:
        assert main(["estimate-memory", str(tmp_path / "odd")]) == 2
        assert "model_type 'xlnet'" in capsys.readouterr().err
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    assert main(["estimate-memory", str(tmp_path / "bad.safetensors")]) == 2
    if importlib.util.find_spec("accel_bigmodel") is None:  # accel-cli installed alone
        assert "needs accel-bigmodel" in capsys.readouterr().err
    else:
        assert "not a readable safetensors file" in capsys.readouterr().err


def test_per_process_arithmetic():
    one = per_process(1000, 100, "float32", 1)
    assert set(one.values()) == {16_000}  # one process: nothing to shard
    four = per_process(1000, 100, "bfloat16", 4)
    assert four == {
        "DDP": 16_000,
        "ZeRO-1": 4_000 + 3_000,  # 16-bit weights and gradients whole, 12 bytes sharded
        "ZeRO-2": 2_000 + 3_500,
        "ZeRO-3": 4_000 + 400,  # all sharded, plus one 100-parameter layer whole
        "FSDP2": 4_000 + 400,
    }
