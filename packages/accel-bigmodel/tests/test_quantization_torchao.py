"""torchao weight-only quantization through `load_and_quantize_model` (accel's own spelling).

References as for bitsandbytes: torchao's own `quantize_` on the same weights (equal outputs),
and the full-precision layer within the bound of the quantization step torchao chose (its
own scales: rounding to the nearest step moves a weight by at most half a step).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accel_bigmodel import init_empty_weights
from accel_bigmodel.quantization import load_and_quantize_model
from accel_testkit import Stack

pytestmark = pytest.mark.needs("torchao")
WIDTH, HIDDEN, DEPTH, IN = 64, 128, 2, 64


def make_stack() -> Stack:
    torch.manual_seed(0)
    return Stack(width=WIDTH, depth=DEPTH, hidden=HIDDEN, in_features=IN, out_features=8).eval()


def configs() -> dict[str, object]:
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return {
        "int8": Int8WeightOnlyConfig(),
        "int4": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    }


@pytest.fixture
def folder(tmp_path) -> str:
    state = {k: v.contiguous() for k, v in make_stack().state_dict().items()}
    save_file(state, os.path.join(tmp_path, "model.safetensors"))
    return str(tmp_path)


def torchao_own(config: object) -> nn.Module:
    from torchao.quantization import quantize_

    model = make_stack()
    quantize_(model, config, filter_fn=lambda m, name: isinstance(m, nn.Linear) and name != "out")
    return model


def scales(weight: torch.Tensor) -> torch.Tensor | None:
    """A torchao weight's scales: its own ``scale`` (torchao's Int8Tensor / Int4Tensor), or its
    storage's (``tensor_impl.scale``: the AffineQuantizedTensor of torch 2.9's torchao 0.14);
    None for a plain tensor."""
    if hasattr(weight, "scale"):
        return weight.scale
    return getattr(getattr(weight, "tensor_impl", None), "scale", None)


def step_bound(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """|x| @ (half a step per weight)^T: the most rounding can move each output, plus fp32."""
    scale = scales(weight).reshape(weight.shape[0], -1)
    half_step = (scale.abs() / 2).repeat_interleave(weight.shape[1] // scale.shape[1], dim=1)
    return x.abs() @ half_step.T + 1e-5


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_torchao_load_equals_its_own_quantize_and_stays_within_half_a_step(
    folder: str, kind: str
) -> None:
    with init_empty_weights():
        empty = make_stack()
    model = load_and_quantize_model(empty, configs()[kind], folder)
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(x), torchao_own(configs()[kind])(x))
        reference = make_stack()
        layer, full = model.blocks[0].up, reference.blocks[0].up
        assert scales(layer.weight) is not None  # a torchao tensor (WIDTH == IN: x fits it)
        error = (layer(x) - full(x)).abs()
        assert (error <= step_bound(layer.weight, x)).all()
        assert error.max() > 0
    assert type(model.out.weight) is nn.Parameter  # the head stays in full precision


def test_torchao_disk_layers_stay_unquantized_and_run(folder: str, tmp_path) -> None:
    device_map = {"inp": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "out": "cpu"}
    with init_empty_weights():
        empty = make_stack()
    model = load_and_quantize_model(
        empty, configs()["int8"], folder, device_map=device_map, offload_folder=str(tmp_path / "o")
    )
    expected = make_stack()
    from torchao.quantization import quantize_

    quantize_(expected.blocks[0], configs()["int8"])
    quantize_(expected.inp, configs()["int8"])
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))
    assert model.blocks[1].up.weight.device.type == "meta"


def test_a_model_with_weights_is_quantized_in_place() -> None:
    model = load_and_quantize_model(make_stack(), configs()["int8"], device_map="cpu")
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(x), torchao_own(configs()["int8"])(x))


def test_another_kind_of_config_is_refused() -> None:
    with pytest.raises(TypeError, match="BnbQuantizationConfig.*or a torchao config"):
        load_and_quantize_model(copy.deepcopy(make_stack()), {"load_in_8bit": True})


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_torchao_load_on_cuda_equals_its_own_quantize_on_cuda(folder: str, kind: str) -> None:
    """Loaded onto cuda:0: the quantized weights live on the GPU, the output equals torchao's
    own quantize_ of the same weights on the GPU, and a layer stays within half a step."""
    cuda = torch.device("cuda", 0)
    with init_empty_weights():
        empty = make_stack()
    model = load_and_quantize_model(empty, configs()[kind], folder, device_map={"": 0})
    from torchao.quantization import quantize_

    own = make_stack().to(cuda)
    quantize_(own, configs()[kind], filter_fn=lambda m, n: isinstance(m, nn.Linear) and n != "out")
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(1)).to(cuda)
    with torch.no_grad():
        assert torch.equal(model(x), own(x))
        layer, full = model.blocks[0].up, make_stack().to(cuda).blocks[0].up
        assert layer.weight.device == cuda and scales(layer.weight) is not None
        error = (layer(x) - full(x)).abs()
        assert (error <= step_bound(layer.weight, x)).all()
        assert error.max() > 0
