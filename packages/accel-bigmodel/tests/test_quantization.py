"""Quantized loading with bitsandbytes on the CPU: outputs, offload, accelerate's helpers, errors.

Every model is accel_testkit's Stack (Linear layers in unsplittable Blocks) written to a real
safetensors file. Two references: the full-precision model, within a bound worked out from
the quantization step, and bitsandbytes' own layers quantizing the same weights, which the
load must match exactly (same kernels, same inputs).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accel_bigmodel import init_empty_weights, set_module_tensor_to_device
from accel_bigmodel.quantization import (
    BnbQuantizationConfig,
    get_keys_to_not_convert,
    get_quantized_model_device_map,
    has_4bit_bnb_layers,
    load_and_quantize_model,
    replace_with_bnb_layers,
)
from accel_testkit import Stack

pytestmark = pytest.mark.needs("bitsandbytes")
WIDTH, HIDDEN, DEPTH, IN = 64, 128, 3, 64
SKIP = ["out"]  # the head stays in full precision, as get_keys_to_not_convert picks it


def make_stack(seed: int = 0) -> Stack:
    torch.manual_seed(seed)
    return Stack(width=WIDTH, depth=DEPTH, hidden=HIDDEN, in_features=IN, out_features=8).eval()


def empty_stack() -> Stack:
    with init_empty_weights():
        return make_stack().eval()


def save(model: nn.Module, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"))
    return folder


def config(bits: str, **kwargs) -> BnbQuantizationConfig:
    if bits == "int8":
        return BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32, **kwargs)
    return BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_quant_type=bits, bnb_4bit_compute_dtype=torch.float32, **kwargs
    )


def bnb_own(reference: nn.Module, cfg: BnbQuantizationConfig) -> nn.Module:
    """bitsandbytes' own quantize-then-run: its layers built on the reference weights, moved."""
    model = copy.deepcopy(reference)
    replace_with_bnb_layers(model, cfg, modules_to_not_convert=list(SKIP))
    return model.to("cpu").eval()  # moving a bitsandbytes layer quantizes it


@pytest.fixture
def reference() -> Stack:
    return make_stack()


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(4, IN, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def folder(reference: Stack, tmp_path) -> str:
    return save(reference, str(tmp_path / "ckpt"))


# -- error bounds from the quantization step ---------------------------------------------------
#
# int8 (LLM.int8, no outliers at these magnitudes): each weight row is scaled by absmax/127 and
# rounded, so |dw| <= absmax_row / 254; the input row is quantized the same way (|dx| <=
# absmax_x / 254), and bitsandbytes casts inputs and weights to fp16 first (relative 2**-11).
# Per output:  |dy_i| <= sum_j |w_ij| |dx_j| + |dw_ij| (|x_j| + |dx_j|)  with those bounds.
# 4-bit: each block of 64 weights is scaled by its absmax; a weight is rounded to the nearest
# code, so |dw| <= absmax_block * (largest gap between adjacent codes) / 2; the matmul runs in
# fp32 on the dequantized weights.


def int8_bound(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = layer.weight.detach()
    fp16 = 2.0**-11
    dw = w.abs().amax(1, keepdim=True) / 254 + w.abs() * fp16
    dx = x.abs().amax(1, keepdim=True) / 254 + x.abs() * fp16
    return dx @ w.abs().T + (x.abs() + dx) @ dw.T + 1e-6


def int4_bound(layer: nn.Linear, x: torch.Tensor, quant_type: str) -> torch.Tensor:
    import bitsandbytes.functional as F

    codes = F.get_4bit_type(quant_type, device="cpu").sort().values
    gap = (codes[1:] - codes[:-1]).max()
    w = layer.weight.detach()
    blocks = w.reshape(-1, 64).abs().amax(1, keepdim=True).expand(-1, 64).reshape(w.shape)
    return x.abs() @ (blocks * gap / 2).T + 1e-5


@pytest.mark.parametrize("bits", ["int8", "nf4", "fp4"])
def test_each_quantized_layer_stays_within_the_step_bound_of_full_precision(
    reference: Stack, folder: str, x: torch.Tensor, bits: str
) -> None:
    model = load_and_quantize_model(empty_stack(), config(bits), folder)
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_pre_hook(lambda mod, a, n=n: inputs.__setitem__(n, a[0]))
        for n, m in reference.named_modules()
        if isinstance(m, nn.Linear)
    ]
    reference(x)
    for h in hooks:
        h.remove()
    quantized = dict(model.named_modules())
    checked = 0
    for name, layer in reference.named_modules():
        if not isinstance(layer, nn.Linear) or name in SKIP:
            continue
        got, want = quantized[name](inputs[name]), layer(inputs[name])
        bound = (
            int8_bound(layer, inputs[name])
            if bits == "int8"
            else int4_bound(layer, inputs[name], bits)
        )
        assert ((got - want).abs() <= bound).all(), (name, (got - want).abs().max().item())
        assert (got - want).abs().max() > 0  # really quantized
        checked += 1
    assert checked == 2 * DEPTH + 1


@pytest.mark.parametrize("bits", ["int8", "nf4"])
def test_load_equals_bitsandbytes_own_quantize_then_run(
    reference: Stack, folder: str, x: torch.Tensor, bits: str
) -> None:
    model = load_and_quantize_model(empty_stack(), config(bits), folder)
    own = bnb_own(reference, config(bits))
    with torch.no_grad():
        assert torch.equal(model(x), own(x))
    layer = model.blocks[0].up
    assert type(layer).__name__ == ("Linear8bitLt" if bits == "int8" else "Linear4bit")
    assert type(model.out) is nn.Linear and model.out.weight.dtype == torch.float32
    assert model.is_loaded_in_8bit == (bits == "int8") and model.is_loaded_in_4bit == (
        bits != "int8"
    )
    assert has_4bit_bnb_layers(model) == (bits != "int8")


def test_a_model_with_weights_quantizes_in_place_like_a_loaded_one(
    reference: Stack, folder: str, x: torch.Tensor
) -> None:
    streamed = load_and_quantize_model(empty_stack(), config("int8"), folder)
    in_place = load_and_quantize_model(copy.deepcopy(reference), config("int8"))
    with torch.no_grad():
        assert torch.equal(in_place(x), streamed(x))


DISK_MAP = {"inp": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "out": "cpu"}


def test_8bit_disk_spill_writes_weights_and_scales_and_runs_the_same(
    reference: Stack, folder: str, x: torch.Tensor, tmp_path
) -> None:
    offload = str(tmp_path / "offload")
    model = load_and_quantize_model(
        empty_stack(), config("int8"), folder, device_map=DISK_MAP, offload_folder=offload
    )
    with open(os.path.join(offload, "index.json")) as f:
        index = json.load(f)
    assert index["blocks.1.up.weight"]["dtype"] == "int8"
    assert index["blocks.2.down.SCB"]["shape"] == [WIDTH]
    assert model.blocks[1].up.weight.device.type == "meta"
    own = bnb_own(reference, config("int8"))
    with torch.no_grad():
        first, second = model(x), model(x)
        assert torch.equal(first, own(x)) and torch.equal(second, first)
    assert model.blocks[1].up.weight.device.type == "meta"  # the hook dropped it again
    assert model.blocks[1].up.state.CB is None  # and the layer kept no copy


def test_auto_map_spills_8bit_blocks_to_disk_under_a_small_budget(
    reference: Stack, folder: str, x: torch.Tensor, tmp_path
) -> None:
    cfg = config("int8")
    planned = get_quantized_model_device_map(
        replace_with_bnb_layers(empty_stack(), cfg, list(SKIP)), cfg, "sequential", {"cpu": 40_000}
    )
    assert "disk" in planned.values()
    model = load_and_quantize_model(
        empty_stack(), config("int8"), folder, device_map="sequential",
        max_memory={"cpu": 40_000}, offload_folder=str(tmp_path / "off"),
    )  # fmt: skip
    assert model.hf_device_map == planned
    with torch.no_grad():
        assert torch.equal(model(x), bnb_own(reference, cfg)(x))


def test_4bit_disk_spill_keeps_offloaded_blocks_unquantized(
    reference: Stack, folder: str, x: torch.Tensor, tmp_path
) -> None:
    model = load_and_quantize_model(
        empty_stack(), config("nf4"), folder, device_map=DISK_MAP, offload_folder=str(tmp_path)
    )
    assert type(model.blocks[0].up).__name__ == "Linear4bit"
    assert type(model.blocks[1].up) is nn.Linear  # offloaded: torch_dtype, as accelerate does
    expected = copy.deepcopy(reference)
    replace_with_bnb_layers(expected, config("nf4"), ["out", "blocks.1", "blocks.2"])
    with torch.no_grad():
        assert torch.equal(model(x), expected.to("cpu").eval()(x))


def test_4bit_auto_map_that_would_offload_is_refused(folder: str, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"offloads the 4-bit modules \['blocks"):
        load_and_quantize_model(
            empty_stack(), config("nf4"), folder, device_map="sequential",
            max_memory={"cpu": 20_000}, offload_folder=str(tmp_path),
        )  # fmt: skip


def test_8bit_weight_and_statistics_placed_by_hand_run_like_the_quantized_layer(
    reference: Stack, x: torch.Tensor
) -> None:
    """set_module_tensor_to_device(..., fp16_statistics=SCB), as accelerate's loaders call it."""
    own = bnb_own(reference, config("int8"))
    stored = own.state_dict()  # bitsandbytes' own: int8 weights and their "SCB" row scales
    with init_empty_weights():
        fresh = replace_with_bnb_layers(make_stack(), config("int8"), list(SKIP)).eval()
    for name in fresh.state_dict():
        owner = name.rpartition(".")[0]
        scb = stored.get(f"{owner}.SCB") if name.endswith(".weight") else None
        set_module_tensor_to_device(fresh, name, "cpu", value=stored[name], fp16_statistics=scb)
    assert torch.equal(fresh.blocks[0].up.weight.SCB, stored["blocks.0.up.SCB"])
    with torch.no_grad():
        assert torch.equal(fresh(x), own(x))


@pytest.mark.needs("accelerate")
def test_keys_to_not_convert_match_accelerate() -> None:
    from accelerate.utils.bnb import get_keys_to_not_convert as theirs

    class Tied(Stack):
        def __init__(self) -> None:
            super().__init__(width=8, in_features=8, out_features=8)
            self.out.weight = self.inp.weight

    for model in (make_stack(), Tied()):
        assert sorted(get_keys_to_not_convert(model)) == sorted(theirs(model))


def test_both_8bit_and_4bit_is_refused() -> None:
    with pytest.raises(ValueError, match="load_in_8bit=True, load_in_4bit=True"):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)


def test_a_skip_list_naming_no_module_is_refused(folder: str) -> None:
    with pytest.raises(ValueError, match=r"skip_modules names \['lm_head'\]"):
        load_and_quantize_model(empty_stack(), config("int8", skip_modules=["lm_head"]), folder)
    with pytest.raises(ValueError, match=r"keep_in_fp32_modules names \['norm'\]"):
        load_and_quantize_model(
            empty_stack(), config("int8", keep_in_fp32_modules=["norm"]), folder
        )


def test_a_device_without_a_bitsandbytes_backend_is_refused(folder: str) -> None:
    with pytest.raises(ValueError, match=r"no backend for the device 'mps'.*run on \['cpu'"):
        load_and_quantize_model(empty_stack(), config("int8"), folder, device_map={"": "mps"})


def test_weights_that_do_not_match_the_model_are_refused(tmp_path) -> None:
    torch.manual_seed(0)
    other = save(
        Stack(width=32, depth=DEPTH, hidden=HIDDEN, in_features=IN, out_features=8), str(tmp_path)
    )
    with pytest.raises(
        ValueError, match=r"do not match Stack: shapes .* \['blocks.0.down.bias: \[32\] vs \[64\]"
    ):
        load_and_quantize_model(empty_stack(), config("nf4"), other)
    with pytest.raises(ValueError, match="weights_location is None"):
        load_and_quantize_model(empty_stack(), config("nf4"))


@pytest.mark.parametrize("bits", ["int8", "nf4"])
def test_dispatching_a_quantized_model_to_disk_keeps_its_outputs(
    reference: Stack, x: torch.Tensor, bits: str, tmp_path
) -> None:
    """The offload hooks take a quantized weight apart (data + statistics) and rebuild it."""
    from accel_bigmodel import dispatch_model

    own = bnb_own(reference, config(bits))
    with torch.no_grad():
        want = own(x)
    model = dispatch_model(bnb_own(reference, config(bits)), DISK_MAP, offload_dir=str(tmp_path))
    with open(os.path.join(tmp_path, "index.json")) as f:
        stored = set(json.load(f))
    assert ("blocks.1.up.SCB" if bits == "int8" else "blocks.1.up.weight.absmax") in stored
    assert model.blocks[1].up.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(model(x), want) and torch.equal(model(x), want)


def test_the_public_names_are_accelerates() -> None:
    from accel_bigmodel import quantization

    assert quantization.__all__ == [
        "BnbQuantizationConfig",
        "get_keys_to_not_convert",
        "get_parameter_device",
        "get_quantized_model_device_map",
        "has_4bit_bnb_layers",
        "load_and_quantize_model",
        "quantize_and_offload_8bit",
        "replace_with_bnb_layers",
    ]


def test_quantize_and_offload_8bit_writes_what_bitsandbytes_quantizes(
    reference: Stack, tmp_path
) -> None:
    from accel_bigmodel import load_offloaded_weight
    from accel_bigmodel.quantization import quantize_and_offload_8bit

    with init_empty_weights():
        model = replace_with_bnb_layers(make_stack(), config("int8"), list(SKIP))
    index: dict = {}
    weight = reference.blocks[0].up.weight.detach()
    quantize_and_offload_8bit(
        model, weight, "blocks.0.up.weight", torch.float16, str(tmp_path), index, None
    )
    own = bnb_own(reference, config("int8")).blocks[0].up.weight
    data = load_offloaded_weight(
        str(tmp_path / "blocks.0.up.weight.dat"), index["blocks.0.up.weight"]
    )
    scb = load_offloaded_weight(str(tmp_path / "blocks.0.up.SCB.dat"), index["blocks.0.up.SCB"])
    assert torch.equal(data, own.CB) and torch.equal(scb, own.SCB)
    assert model.blocks[0].up.weight.device.type == "meta"


@pytest.mark.parametrize("bits", ["int8", "nf4"])
def test_a_full_precision_weight_offloaded_for_a_quantized_layer_is_quantized_each_forward(
    reference: Stack, folder: str, x: torch.Tensor, bits: str
) -> None:
    """transformers leaves the checkpoint's own float32 tensors in place for the quantized
    layers it maps to disk; the hooks quantize them before each forward, as accelerate's do."""
    from accel_bigmodel import dispatch_model
    from accel_bigmodel._offload import safetensors_entries

    with init_empty_weights():
        model = replace_with_bnb_layers(make_stack(), config(bits), list(SKIP)).eval()
    index = safetensors_entries(os.path.join(folder, "model.safetensors"))
    model = dispatch_model(model, {"": "disk"}, offload_index=index)
    own = bnb_own(reference, config(bits))
    with torch.no_grad():
        want = own(x)
        assert torch.equal(model(x), want) and torch.equal(model(x), want)
    assert model.blocks[0].up.weight.device.type == "meta"


# -- on a CUDA GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("bits", ["int8", "nf4", "fp4"])
def test_cuda_load_equals_bitsandbytes_own_on_cuda_and_stays_within_the_step_bound(
    reference: Stack, folder: str, x: torch.Tensor, bits: str
) -> None:
    """Loaded onto cuda:0 (device_map {"": 0}): every quantized layer's weight is on the GPU,
    the model's output equals bitsandbytes' own layers quantized on the GPU (same CUDA kernels,
    same inputs), and each layer stays within the quantization step's bound of full precision
    (the CPU test's bounds: the int8 kernels run fp16 inputs, the 4-bit ones dequantize to
    the fp32 compute dtype)."""
    cuda = torch.device("cuda", 0)
    cfg = config(bits)
    model = load_and_quantize_model(empty_stack(), cfg, folder, device_map={"": 0})
    layer = model.blocks[0].up
    assert type(layer).__name__ == ("Linear8bitLt" if bits == "int8" else "Linear4bit")
    assert all(p.device == cuda for p in model.parameters())
    own = copy.deepcopy(reference)
    replace_with_bnb_layers(own, cfg, modules_to_not_convert=list(SKIP))
    own = own.to(cuda).eval()  # moving a bitsandbytes layer to the GPU quantizes it there
    xc = x.to(cuda)
    with torch.no_grad():
        assert torch.equal(model(xc), own(xc))
    inputs: dict[str, torch.Tensor] = {}
    full = copy.deepcopy(reference).to(cuda)
    hooks = [
        m.register_forward_pre_hook(lambda mod, a, n=n: inputs.__setitem__(n, a[0]))
        for n, m in full.named_modules()
        if isinstance(m, nn.Linear)
    ]
    with torch.no_grad():
        full(xc)
    for h in hooks:
        h.remove()
    quantized = dict(model.named_modules())
    checked = 0
    with torch.no_grad():
        for name, layer in full.named_modules():
            if not isinstance(layer, nn.Linear) or name in SKIP:
                continue
            got, want = quantized[name](inputs[name]).float(), layer(inputs[name])
            bound = (
                int8_bound(layer, inputs[name])
                if bits == "int8"
                else int4_bound(layer.cpu(), inputs[name].cpu(), bits).to(cuda)
            )
            layer.to(cuda)
            assert ((got - want).abs() <= bound).all(), (name, (got - want).abs().max().item())
            assert (got - want).abs().max() > 0  # really quantized
            checked += 1
    assert checked == 2 * DEPTH + 1
