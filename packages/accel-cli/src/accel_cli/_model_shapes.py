"""Where `accel estimate-memory` learns a model's parameters, offline.

Three sources, each giving the parameter names and sizes (`ModelShape`):
- a folder with a transformers-style `config.json`: the parameters are counted from the
  config's fields for the families below (no transformers, no torch needed);
- a `.safetensors` file or a folder of shards: only the JSON headers are read, by
  accel-bigmodel's parser (imported then; an install hint when it is missing);
- `MODULE:FACTORY` (or `path/to/file.py:FACTORY`): the factory builds the model under torch's
  meta device, so no memory is allocated.
Parameters are grouped into layers the way big-model loading splits a model: everything under
a numbered block (`model.layers.3`) is one layer, any other parameter belongs to its module.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from accel_cli._config import ConfigError, ConfigFileNotFound

_FACTORY = re.compile(r"^(?P<module>[^:]+):(?P<name>[A-Za-z_][A-Za-z0-9_.]*)$")


@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes an activation estimate needs."""

    hidden: int
    layers: int
    intermediate: int  # MLP width a token goes through (top-k experts summed for MoE)
    kv_dim: int  # width of each of k and v
    vocab: int | None  # None: no LM head, so no logits
    gated_mlp: bool  # SwiGLU-style (gate and up projections) or a plain two-layer MLP


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The parameters of a model, grouped into layers, and where they were read."""

    source: str
    method: str  # how the parameters were counted, for the report
    params: dict[str, int]  # parameter name -> number of elements
    dims: Dims | None = None
    stored_bytes: int | None = None  # bytes on disk, for checkpoints
    stored_dtypes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.params.values())

    def layers(self) -> dict[str, int]:
        """Layer name -> parameters in it."""
        out: dict[str, int] = {}
        for name, numel in self.params.items():
            layer = layer_of(name)
            out[layer] = out.get(layer, 0) + numel
        return out

    def largest_layer(self) -> tuple[str, int]:
        layers = self.layers()
        if not layers:
            return ("(none)", 0)
        name = max(layers, key=lambda k: layers[k])
        return name, layers[name]


def layer_of(name: str) -> str:
    """`model.layers.3.mlp.up_proj.weight` -> `model.layers.3`; `lm_head.weight` -> `lm_head`."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


# -- config.json -----------------------------------------------------------------------------

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "gemma"}
_TIED_BY_DEFAULT = {"gemma"}
_BERT_LIKE = {"bert", "roberta"}


def _get(cfg: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    if default is None:
        raise ConfigError(f"config.json has none of {', '.join(names)}; cannot count parameters.")
    return default


def _linear(out: dict[str, int], name: str, n_in: int, n_out: int, bias: bool) -> None:
    out[f"{name}.weight"] = n_in * n_out
    if bias:
        out[f"{name}.bias"] = n_out


def llama_like(cfg: Mapping[str, Any]) -> tuple[dict[str, int], Dims]:
    """Llama, Mistral, Qwen2/3, Mixtral and Gemma: the decoder-only shape with RMSNorm."""
    kind = cfg.get("model_type", "llama")
    h, v = _get(cfg, "hidden_size"), _get(cfg, "vocab_size")
    n_layers, inter = _get(cfg, "num_hidden_layers"), _get(cfg, "intermediate_size")
    heads = _get(cfg, "num_attention_heads")
    kv_heads = _get(cfg, "num_key_value_heads", default=heads)
    head_dim = cfg.get("head_dim") or h // heads
    qkv_bias = bool(cfg.get("attention_bias", kind == "qwen2"))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    experts = cfg.get("num_local_experts") if kind == "mixtral" else None
    p: dict[str, int] = {"model.embed_tokens.weight": v * h}
    for i in range(n_layers):
        a = f"model.layers.{i}.self_attn"
        _linear(p, f"{a}.q_proj", h, heads * head_dim, qkv_bias)
        _linear(p, f"{a}.k_proj", h, kv_heads * head_dim, qkv_bias)
        _linear(p, f"{a}.v_proj", h, kv_heads * head_dim, qkv_bias)
        _linear(p, f"{a}.o_proj", heads * head_dim, h, bool(cfg.get("attention_bias", False)))
        if kind == "qwen3":
            p[f"{a}.q_norm.weight"] = p[f"{a}.k_norm.weight"] = head_dim
        if experts:
            m = f"model.layers.{i}.block_sparse_moe"
            p[f"{m}.gate.weight"] = h * experts
            for e in range(experts):
                for w, (n_in, n_out) in (
                    ("w1", (h, inter)),
                    ("w2", (inter, h)),
                    ("w3", (h, inter)),
                ):
                    p[f"{m}.experts.{e}.{w}.weight"] = n_in * n_out
        else:
            m = f"model.layers.{i}.mlp"
            _linear(p, f"{m}.gate_proj", h, inter, mlp_bias)
            _linear(p, f"{m}.up_proj", h, inter, mlp_bias)
            _linear(p, f"{m}.down_proj", inter, h, mlp_bias)
        p[f"model.layers.{i}.input_layernorm.weight"] = h
        p[f"model.layers.{i}.post_attention_layernorm.weight"] = h
    p["model.norm.weight"] = h
    if not cfg.get("tie_word_embeddings", kind in _TIED_BY_DEFAULT):
        p["lm_head.weight"] = v * h
    per_token = inter * (cfg.get("num_experts_per_tok", 2) if experts else 1)
    return p, Dims(h, n_layers, per_token, kv_heads * head_dim, v, gated_mlp=True)


def gpt2(cfg: Mapping[str, Any]) -> tuple[dict[str, int], Dims]:
    """GPT-2: learned positions, LayerNorm with bias, a 4x GELU MLP, LM head tied."""
    h, v = _get(cfg, "n_embd", "hidden_size"), _get(cfg, "vocab_size")
    n_layers = _get(cfg, "n_layer", "num_hidden_layers")
    positions = _get(cfg, "n_positions", "max_position_embeddings")
    inter = cfg.get("n_inner") or 4 * h
    p = {"transformer.wte.weight": v * h, "transformer.wpe.weight": positions * h}
    for i in range(n_layers):
        b = f"transformer.h.{i}"
        for norm in ("ln_1", "ln_2"):
            p[f"{b}.{norm}.weight"] = p[f"{b}.{norm}.bias"] = h
        _linear(p, f"{b}.attn.c_attn", h, 3 * h, True)
        _linear(p, f"{b}.attn.c_proj", h, h, True)
        _linear(p, f"{b}.mlp.c_fc", h, inter, True)
        _linear(p, f"{b}.mlp.c_proj", inter, h, True)
    p["transformer.ln_f.weight"] = p["transformer.ln_f.bias"] = h
    if not cfg.get("tie_word_embeddings", True):
        p["lm_head.weight"] = v * h
    return p, Dims(h, n_layers, inter, h, v, gated_mlp=False)


def bert(cfg: Mapping[str, Any]) -> tuple[dict[str, int], Dims]:
    """BERT and RoBERTa encoders (the base model with its pooler, no task head)."""
    h, v = _get(cfg, "hidden_size"), _get(cfg, "vocab_size")
    n_layers, inter = _get(cfg, "num_hidden_layers"), _get(cfg, "intermediate_size")
    p = {
        "embeddings.word_embeddings.weight": v * h,
        "embeddings.position_embeddings.weight": _get(cfg, "max_position_embeddings") * h,
        "embeddings.token_type_embeddings.weight": _get(cfg, "type_vocab_size", default=2) * h,
        "embeddings.LayerNorm.weight": h,
        "embeddings.LayerNorm.bias": h,
    }
    for i in range(n_layers):
        b = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            _linear(p, f"{b}.attention.self.{name}", h, h, True)
        _linear(p, f"{b}.attention.output.dense", h, h, True)
        _linear(p, f"{b}.intermediate.dense", h, inter, True)
        _linear(p, f"{b}.output.dense", inter, h, True)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            p[f"{b}.{norm}.weight"] = p[f"{b}.{norm}.bias"] = h
    _linear(p, "pooler.dense", h, h, True)
    return p, Dims(h, n_layers, inter, h, None, gated_mlp=False)


FAMILIES = {
    **dict.fromkeys(_LLAMA_LIKE, llama_like),
    "gpt2": gpt2,
    **dict.fromkeys(_BERT_LIKE, bert),
}


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"Cannot read {str(path)!r}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r} does not hold a JSON object.")
    return data


def from_config(cfg: Mapping[str, Any], source: str) -> ModelShape:
    """Count the parameters from a transformers config, by formula for known families."""
    kind = str(cfg.get("model_type", ""))
    family = FAMILIES.get(kind)
    if family is None:
        return _from_transformers(cfg, source, kind)
    params, dims = family(cfg)
    return ModelShape(source, f"counted from config.json ({kind})", params, dims)


def dims_from_config(cfg: Mapping[str, Any]) -> Dims | None:
    """The activation sizes from a config, or None when the family is unknown."""
    family = FAMILIES.get(str(cfg.get("model_type", "")))
    try:
        return family(cfg)[1] if family else None
    except ConfigError:
        return None


def _from_transformers(cfg: Mapping[str, Any], source: str, kind: str) -> ModelShape:
    known = ", ".join(sorted(FAMILIES))
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(
            f"model_type {kind!r} in {source}: accel counts {known} from config.json alone. "
            f"For another family pass its .safetensors files, or install transformers "
            f"(`pip install transformers`) to build it on the meta device."
        )
    import torch
    import transformers

    arch = (cfg.get("architectures") or [None])[0]
    try:
        config = transformers.AutoConfig.for_model(**dict(cfg))
        builder = getattr(transformers, arch, None) if arch else None
        with torch.device("meta"):
            model = builder(config) if builder else transformers.AutoModel.from_config(config)
    except Exception as err:  # whatever transformers raises for a config it cannot build
        raise ConfigError(f"transformers could not build {source} ({kind}): {err}") from None
    params = {name: p.numel() for name, p in model.named_parameters()}
    return ModelShape(source, f"built with transformers on the meta device ({kind})", params)


# -- safetensors -----------------------------------------------------------------------------


def stored_tensors(path: Path) -> list[Any]:
    """The tensors a .safetensors file's header lists (the tensors themselves are not read).

    accel-bigmodel's parser reads the header, the same one its checkpoint loader uses; it is
    imported here, when a safetensors source is given, so accel-cli does not depend on it.
    """
    try:
        from accel_bigmodel import read_safetensors_header
    except ImportError:
        raise ConfigError(
            f"Reading the safetensors headers of {str(path)!r} needs accel-bigmodel, which is "
            f"not installed: pip install accel-bigmodel (or pass the model's config.json)."
        ) from None
    try:
        return read_safetensors_header(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{str(path)!r} is not a readable safetensors file ({err}).") from None


def from_safetensors(files: Iterable[Path], source: str) -> ModelShape:
    params: dict[str, int] = {}
    stored = 0
    dtypes: set[str] = set()
    for path in files:
        for tensor in stored_tensors(path):
            params[tensor.name] = math.prod(tensor.shape)
            stored += tensor.nbytes
            dtypes.add(tensor.dtype)
    return ModelShape(
        source,
        "read from safetensors headers",
        params,
        stored_bytes=stored,
        stored_dtypes=tuple(sorted(dtypes)),
    )


def _shards(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map") or {}
        files = sorted({folder / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConfigError(f"{index} names shards that are not there: {', '.join(missing)}.")
        return files
    return sorted(folder.glob("*.safetensors"))


# -- MODULE:FACTORY --------------------------------------------------------------------------


def from_factory(spec: str) -> ModelShape:
    """Build the model with the factory under the meta device and list its parameters."""
    match = _FACTORY.match(spec)
    assert match, spec
    module_name, attr = match["module"], match["name"]
    import torch

    module = _import(module_name)
    factory: Any = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ConfigError(f"{module_name!r} has no {attr!r} (from {spec!r}).")
        factory = getattr(factory, part)
    with torch.device("meta"):
        model = (
            factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory
        )
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{spec!r} returned a {type(model).__name__}, not a torch.nn.Module.")
    params = {name: p.numel() for name, p in model.named_parameters()}
    cfg = getattr(model, "config", None)
    dims = dims_from_config(cfg.to_dict()) if hasattr(cfg, "to_dict") else None
    return ModelShape(spec, "built by the factory on the meta device", params, dims)


def _import(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"{name!r} does not exist.")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(f"Cannot import {name!r}: {err}.") from None


# -- dispatch --------------------------------------------------------------------------------


def load_shape(source: str, environ: Mapping[str, str]) -> ModelShape:
    """The model shape from a folder, a safetensors file, MODULE:FACTORY or a cached Hub name."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix == ".safetensors":
            shape = from_safetensors([path], str(path))
            return _with_dims(shape, path.parent / "config.json")
        if path.name.endswith(".json"):
            return from_config(read_json(path), str(path))
        raise ConfigError(
            f"{source!r} is neither a .safetensors file nor a config.json; pass the model's "
            f"folder, a .safetensors file, or MODULE:FACTORY."
        )
    if path.is_dir():
        shards = _shards(path)
        if shards:
            return _with_dims(from_safetensors(shards, str(path)), path / "config.json")
        if (path / "config.json").is_file():
            return from_config(read_json(path / "config.json"), str(path / "config.json"))
        raise ConfigError(f"The folder {source!r} has no config.json and no .safetensors files.")
    if _FACTORY.match(source) and not source.startswith(("hf://", "http")):
        return from_factory(source)
    return _from_hub_cache(source, environ)


def _with_dims(shape: ModelShape, config_json: Path) -> ModelShape:
    if not config_json.is_file():
        return shape
    dims = dims_from_config(read_json(config_json))
    return dataclasses.replace(shape, dims=dims) if dims else shape


def _from_hub_cache(name: str, environ: Mapping[str, str]) -> ModelShape:
    """A Hub name works only when huggingface_hub is installed and can reach the file."""
    offline = (
        f"{name!r} is not a local folder, file or MODULE:FACTORY. estimate-memory works "
        f"offline: put the model's config.json (or its .safetensors files) in a folder and "
        f"pass that folder."
    )
    if importlib.util.find_spec("huggingface_hub") is None:
        raise ConfigFileNotFound(offline)
    from huggingface_hub import hf_hub_download

    try:
        found = Path(hf_hub_download(repo_id=name, filename="config.json"))
    except Exception as err:  # no network, unknown repo, gated repo: all end here
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigFileNotFound(  # an OSError, as a Hub name that cannot be read is
            f"{offline} (The Hub was tried and failed: {reason[:200]})"
        ) from None
    return from_config(read_json(found), f"{name} (config.json from the Hub cache)")
